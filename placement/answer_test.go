package placement

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// gate is a Gate that refuses with refusal ("" lets the core decide).
type gate struct{ refusal string }

func (g gate) NotReady() string       { return "" }
func (g gate) Leading() bool          { return true }
func (g gate) DeciderRefusal() string { return g.refusal }

// countingObserver counts what the core reports.
type countingObserver struct {
	nopObserver
	filtered map[Reason]int
	failed   map[ErrorKind]int
}

func (o *countingObserver) Filtered(r Reason, n int)    { o.filtered[r] += n }
func (o *countingObserver) Failed(_ Phase, k ErrorKind) { o.failed[k]++ }
func newCountingObserver() *countingObserver {
	return &countingObserver{filtered: map[Reason]int{}, failed: map[ErrorKind]int{}}
}
func (o *countingObserver) String() string { return fmt.Sprint(o.filtered, o.failed) }
func (o *countingObserver) total() (n int) {
	for _, v := range o.filtered {
		n += v
	}
	return n
}

// A core that may not decide (another scheduler holds the decider Lease)
// refuses to filter with the Gate's words and counts the refusal; a pod
// without GPUs passes everywhere even then.
func TestFilterRefusesWhileTheGateRefuses(t *testing.T) {
	obs := newCountingObserver()
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	x, err := New(Options{Config: cfg, Observer: obs, Gate: gate{refusal: "GPUs are decided by another gputopo scheduler"}})
	if err != nil {
		t.Fatal(err)
	}
	names := feedNodes(t, x, "dgx-a100", 2, func(int) map[string]string { return nil })
	_, err = x.Filter(context.Background(), request(t, x, gpuPod("p", 1, reqAnn(""))), names)
	if err == nil || !strings.Contains(err.Error(), "decided by another gputopo scheduler") {
		t.Errorf("Filter while the gate refuses: %v, want the gate's refusal", err)
	}
	if obs.failed[ErrNotDecider] != 1 {
		t.Errorf("counts %s, want one not-decider failure", obs)
	}
	ans, err := x.Filter(context.Background(), request(t, x, gpuPod("cpu", 0, reqAnn(""))), names)
	if err != nil || len(ans.Passed) != 2 {
		t.Errorf("a pod without GPUs: %+v, %v; want it to pass both nodes", ans, err)
	}
}

// Filter, Explain and the counts agree: every node Filter refuses has the
// same reason in Explain, every node it passes Explain passes with a score,
// and each node is counted once, by its reason.
func TestFilterExplainAndCountsAgree(t *testing.T) {
	obs := newCountingObserver()
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	x, err := New(Options{Config: cfg, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	x.setClock(func() time.Time { return groupEpoch })
	names := append(feedNodes(t, x, "dgx1-v100", 3, func(int) map[string]string { return nil }), "no-such-node")
	// Fill node-0 so that 4 GPUs no longer fit there.
	for i, n := range []int{3, 2} {
		place(t, x, names[:1], gpuPod(fmt.Sprintf("fill-%d", i), n, reqAnn("")))
	}
	pr := request(t, x, gpuPod("mp", 4, reqAnn(`{"requireNVLink":true,"strategy":"highest_bandwidth"}`)))
	obs.filtered = map[Reason]int{}
	ans, err := x.Filter(context.Background(), pr, names)
	if err != nil {
		t.Fatal(err)
	}
	if obs.total() != len(names) {
		t.Errorf("counted %d nodes (%s), want %d", obs.total(), obs, len(names))
	}
	if len(ans.Passed) != 2 || len(ans.Failed)+len(ans.Unresolvable) != 2 {
		t.Fatalf("Filter: %+v; want node-1 and node-2 passed, node-0 and the unknown node refused", ans)
	}
	for _, e := range x.Explain(context.Background(), pr, names) {
		want, refused := ans.Failed[e.Node]
		if r, ok := ans.Unresolvable[e.Node]; ok {
			want, refused = r, true
		}
		switch {
		case refused && (e.Passed || e.Reason != want):
			t.Errorf("Explain %s: passed %v %q; Filter refused it: %q", e.Node, e.Passed, e.Reason, want)
		case !refused && (!e.Passed || e.Score < 0 || len(e.Result.GPUs) != 4):
			t.Errorf("Explain %s: %+v; Filter passed it, want a score and 4 GPUs", e.Node, e)
		}
	}
}
