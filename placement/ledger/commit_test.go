package ledger_test

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// Two reservations whose choices run at the same time, under the read
// lock, and pick the same GPU: one is recorded, the other finds the GPU
// taken and chooses again, so they never share a GPU.
func TestReservationsChosenTogetherNeverShareAGPU(t *testing.T) {
	l := newLedger(t, "a")
	var arrived sync.WaitGroup
	arrived.Add(2)
	both := make(chan struct{})
	go func() { arrived.Wait(); close(both) }()
	var calls atomic.Int32
	choose := func(v ledger.View, n *ledger.Node) (ledger.Choice, error) {
		if calls.Add(1) <= 2 {
			// Both first choices are in flight at once, each seeing
			// GPU 0 free.
			arrived.Done()
			select {
			case <-both:
			case <-time.After(2 * time.Second):
				t.Error("the two choices never ran at the same time: Reserve chooses under the write lock")
			}
		}
		return firstFree(1)(v, n)
	}
	got := make([][]string, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"p", "q"} {
		wg.Go(func() {
			c, err := l.Reserve(types.UID("uid-"+name), key(name), "a", choose)
			if err != nil {
				t.Error(err)
			}
			got[i] = c.UUIDs
		})
	}
	wg.Wait()
	if len(got[0]) != 1 || len(got[1]) != 1 || slices.Equal(got[0], got[1]) {
		t.Fatalf("reservations chosen together got %v and %v, want one different GPU each", got[0], got[1])
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("choose ran %d times, want 3 (the second to commit chooses again)", n)
	}
	if f := free(l, "a").Count(); f != 6 {
		t.Errorf("%d GPUs free after two 1-GPU reservations on an 8-GPU node, want 6", f)
	}
}

// A group's plan is chosen under the read lock: the scheduling cycle's
// filters read the ledger while the planner works. Its slots are held at
// once when it is recorded; a plan whose GPUs were taken meanwhile is
// chosen again.
func TestGroupPlanIsChosenWhileOthersRead(t *testing.T) {
	l := newLedger(t, "a", "b")
	for _, name := range []string{"g-0", "g-1"} {
		p := pod(name, "", "", 8)
		p.Annotations = map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "2"}
		l.UpsertPod(p)
	}
	var calls atomic.Int32
	err := l.PlanGroup("ns/g", func(v ledger.View, g ledger.GroupView) ([]ledger.Slot, string, string, error) {
		if calls.Add(1) == 1 {
			read := make(chan struct{})
			go func() {
				l.Read(func(ledger.View) {})
				close(read)
			}()
			select {
			case <-read:
			case <-time.After(2 * time.Second):
				t.Fatal("a read waited for the group planner: it plans under the write lock")
			}
			// Another pod's reservation lands while the plan is being
			// chosen: it takes GPU 0 of node a. Its choice runs now; it
			// records it as soon as the planner lets go of the read lock.
			chosen := make(chan struct{})
			go func() {
				if _, err := l.Reserve("uid-other", key("other"), "a", func(v ledger.View, n *ledger.Node) (ledger.Choice, error) {
					defer close(chosen)
					return firstFree(1)(v, n)
				}); err != nil {
					t.Error(err)
				}
			}()
			<-chosen
			time.Sleep(200 * time.Millisecond) // it waits for the write lock
		}
		var slots []ledger.Slot
		for _, node := range []string{"a", "b"} {
			c, err := firstFree(8)(v, v.Node(node))
			if err != nil {
				return nil, "", "", err
			}
			slots = append(slots, ledger.Slot{Node: node, Choice: c})
		}
		return slots, "cluster", "cluster", nil
	})
	if err == nil {
		t.Fatal("the plan was recorded although node a lost a GPU while it was chosen, or chosen again on a node with 7 free")
	}
	if n := calls.Load(); n != 2 {
		t.Errorf("choose ran %d times, want 2 (the first plan's GPUs were taken, so it is chosen again)", n)
	}
	if f := free(l, "b").Count(); f != 8 {
		t.Errorf("node b has %d free GPUs after a plan that was not recorded, want 8", f)
	}
}

// HoldersBelow follows the pods that hold GPUs: bound, reserved, gone.
func TestHoldersBelowFollowsHoldings(t *testing.T) {
	l := newLedger(t, "a")
	below := func(prio int32) (b bool) {
		l.Read(func(v ledger.View) { b = v.HoldersBelow(prio) })
		return b
	}
	low := pod("low", "a", "", 1, firstUUID(t, l, "a"))
	p100 := int32(100)
	low.Spec.Priority = &p100
	l.UpsertPod(low)
	if !below(101) || below(100) {
		t.Errorf("one pod of priority 100 bound: below 101 %v, below 100 %v; want true, false", below(101), below(100))
	}
	pending := pod("pending", "", "", 1)
	l.UpsertPod(pending)
	if _, err := l.Reserve(pending.UID, key("pending"), "a", firstFree(1)); err != nil {
		t.Fatal(err)
	}
	if !below(1) {
		t.Error("a reserved pod of priority 0: HoldersBelow(1) is false")
	}
	l.DeletePod(types.NamespacedName{Namespace: low.Namespace, Name: low.Name}, low.UID)
	l.Release(pending.UID)
	if below(1000) {
		t.Error("HoldersBelow(1000) after every holder left")
	}
}

// firstUUID is the UUID of GPU 0 of node.
func firstUUID(t *testing.T, l *ledger.Ledger, node string) string {
	t.Helper()
	var u string
	l.Read(func(v ledger.View) { u = v.Node(node).Graph().GPUs()[0].UUID })
	return u
}
