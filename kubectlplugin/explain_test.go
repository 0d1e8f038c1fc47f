package kubectlplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// fakeCluster serves the snapshot's objects and extra ones (Events, Jobs)
// from controller-runtime's fake client. Events are indexed by the fields
// kube-apiserver lets a field selector name, so that the plugin's
// selectors are checked the way the API server checks them: a field it
// does not index fails the list.
func fakeCluster(t *testing.T, s *Snapshot, extra ...client.Object) client.Reader {
	t.Helper()
	var objs []client.Object
	for i := range s.Nodes {
		objs = append(objs, &s.Nodes[i])
	}
	for i := range s.Topologies {
		objs = append(objs, &s.Topologies[i])
	}
	for i := range s.Pods {
		objs = append(objs, &s.Pods[i])
	}
	b := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(append(objs, extra...)...)
	for _, f := range []string{fieldObjectUID, fieldObjectName, fieldObjectKind, fieldReason} {
		b = b.WithIndex(&corev1.Event{}, f, func(o client.Object) []string { return []string{eventField(o.(*corev1.Event), f)} })
	}
	return b.Build()
}

// runPlugin runs `kubectl gputopo ARGS` against c at the tests' fixed now,
// with the default extender configuration (the ConfigMap is absent).
func runPlugin(t *testing.T, c client.Reader, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newCommand(&Options{Out: &out, ErrOut: &errOut,
		connect: func(context.Context, *Options) (client.Reader, error) { return c, nil },
		now:     func() time.Time { return now }})
	cmd.SetArgs(append([]string{"--color", "never", "-n", "team"}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// golden compares got with testdata/name; UPDATE_GOLDEN=1 rewrites it.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (UPDATE_GOLDEN=1 go test ./kubectlplugin/ writes it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got); if intended, rerun with UPDATE_GOLDEN=1:\n%s", path, diff)
	}
}

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

// event is an Event about obj as kube-scheduler or a controller records it
// (core/v1 fields; count > 1 is a series).
func event(obj client.Object, kind, typ, reason, from, msg string, count int32, first, last time.Duration) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: obj.GetName() + "." + strings.ToLower(reason)},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID()},
		Type:           typ, Reason: reason, Message: msg, Source: corev1.EventSource{Component: from},
		Count: count, FirstTimestamp: ago(first), LastTimestamp: ago(last),
	}
}

func pendingPod(name, scheduler string, gpus int64, ann map[string]string) corev1.Pod {
	p := pod(name, "", gpus, ann)
	p.Spec.SchedulerName = scheduler
	p.Status = corev1.PodStatus{Phase: corev1.PodPending}
	return p
}

// A pod that names another scheduler: gputopo never decides it, and
// explain says that before what gputopo would do.
func TestExplainPodOfAnotherScheduler(t *testing.T) {
	s := cluster(t)
	p := pendingPod("count-only", corev1.DefaultSchedulerName, 2, nil)
	s.Pods = append(s.Pods, p)
	c := fakeCluster(t, s)
	out, err := runPlugin(t, c, "explain", "count-only")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "explain-other-scheduler.txt", out)
	for _, want := range []string{"default-scheduler is not a gputopo profile (gputopo-scheduler): gputopo never decides this pod", "What gputopo would do, were the pod routed to it", "PodScheduled: not set"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "would take it now") {
		t.Errorf("explain says nodes would take a pod gputopo does not decide:\n%s", out)
	}

	// A custom profile named with --scheduler-name is gputopo's.
	out, err = runPlugin(t, c, "explain", "count-only", "-o", "json", "--scheduler-name", "gputopo-scheduler", "--scheduler-name", "batch,default-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	var e Explanation
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatal(err)
	}
	if !e.GputopoDecides || !cmp.Equal(e.Profiles, []string{"gputopo-scheduler", "batch", "default-scheduler"}) {
		t.Errorf("with --scheduler-name: decides %v, profiles %v", e.GputopoDecides, e.Profiles)
	}
}

// kube-scheduler cannot reach the extender: PodScheduled False,
// SchedulerError, and a FailedScheduling event with the same message.
func TestExplainWhenTheExtenderIsDown(t *testing.T) {
	s := cluster(t)
	const refused = `Post "http://gputopo-extender.gputopo-system.svc:8080/scheduler/filter": dial tcp 10.96.41.7:8080: connect: connection refused`
	p := pendingPod("train-0", v1alpha1.DefaultSchedulerName, 4, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`})
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: ReasonSchedulerError, Message: refused, LastTransitionTime: ago(3 * time.Minute)}}
	s.Pods = append(s.Pods, p)
	evs := []client.Object{
		event(&p, "Pod", corev1.EventTypeWarning, "FailedScheduling", v1alpha1.DefaultSchedulerName, refused, 4, 3*time.Minute, 20*time.Second),
		// An earlier pod of the same name: another UID, not shown.
		event(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "train-0", UID: "uid-earlier"}}, "Pod", corev1.EventTypeNormal, "Scheduled", v1alpha1.DefaultSchedulerName, "Successfully assigned team/train-0 to v100", 1, time.Hour, time.Hour),
	}
	evs[1].SetName("train-0.earlier")
	out, err := runPlugin(t, fakeCluster(t, s, evs...), "explain", "train-0")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "explain-extender-down.txt", out)
	for _, want := range []string{"PodScheduled: False, SchedulerError, 3m ago: " + refused, "cannot reach gputopo's extender", "20s (x4 over 3m)", "once the scheduler gets gputopo's answer"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Successfully assigned") {
		t.Errorf("explain shows an earlier pod's event:\n%s", out)
	}
}

// The webhook refuses a Job's pods: they never exist, and the refusal is a
// FailedCreate event on the Job. explain NAME (no pod of that name) and
// explain --job NAME both show it.
func TestExplainJobWhosePodsTheWebhookRefuses(t *testing.T) {
	s := cluster(t)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "bad-env", UID: "uid-job"}}
	const denied = `Error creating: admission webhook "vpod.gputopo.io" denied the request: spec.containers[0].env[0]: Forbidden: container "main" requests nvidia.com/gpu, so NVIDIA_VISIBLE_DEVICES must not be set there: the node agent gives the container exactly the devices kubelet allocated; remove this entry`
	c := fakeCluster(t, s, job,
		event(job, "Job", corev1.EventTypeWarning, "FailedCreate", "job-controller", denied, 6, 5*time.Minute, 40*time.Second))
	out, err := runPlugin(t, c, "explain", "--job", "bad-env")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "explain-webhook-refusal.txt", out)
	for _, want := range []string{"Job team/bad-env", "6 pod creation(s) failed (FailedCreate)", denied, "pods:         none live"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain --job lacks %q:\n%s", want, out)
		}
	}
	byName, err := runPlugin(t, c, "explain", "bad-env")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(out, byName); diff != "" {
		t.Errorf("explain bad-env (no such pod) differs from explain --job bad-env:\n%s", diff)
	}
	// A name that nothing has.
	if _, err := runPlugin(t, c, "explain", "nothing"); err == nil || !strings.Contains(err.Error(), "no Job or other workload named nothing") {
		t.Errorf("explain of an unknown name: %v", err)
	}
}

// A Job with live pods lists them with their PodScheduled state.
func TestExplainJobListsItsPods(t *testing.T) {
	s := cluster(t)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "train", UID: "uid-train"}}
	p := pendingPod("train-abcde", v1alpha1.DefaultSchedulerName, 2, nil)
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: job.UID, Controller: ptrTrue()}}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: ReasonUnschedulable}}
	s.Pods = append(s.Pods, p)
	out, err := runPlugin(t, fakeCluster(t, s, job), "explain", "--job", "train", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var o OwnerExplanation
	if err := json.Unmarshal([]byte(out), &o); err != nil {
		t.Fatal(err)
	}
	want := []OwnedPod{{Name: "train-abcde", Phase: "Pending", Scheduled: "False Unschedulable"}}
	if diff := cmp.Diff(want, o.Pods); diff != "" || o.Refused != 0 || len(o.Events.Items) != 0 {
		t.Errorf("explain --job train: %+v (-want +got pods):\n%s", o, diff)
	}
}

func ptrTrue() *bool { b := true; return &b }

// A Node that advertises 8 GPUs but has no NodeGPUTopology: the nodes
// view shows what it advertises and that its topology is missing, and
// explain gives it the extender's reason.
func TestNodeWithoutTopology(t *testing.T) {
	s := cluster(t)
	s.Nodes = append(s.Nodes, node("legacy", 8, nil))
	p := pendingPod("notebook", v1alpha1.DefaultSchedulerName, 1, nil)
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: ReasonUnschedulable,
		Message: "0/4 nodes are available: 1 gputopo: node has no NodeGPUTopology; the gputopo node agent has not published its GPUs (is it running on this node?). preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling.", LastTransitionTime: ago(90 * time.Second)}}
	p.UID = k8stypes.UID("uid-notebook")
	s.Pods = append(s.Pods, p)
	c := fakeCluster(t, s, event(&p, "Pod", corev1.EventTypeWarning, "FailedScheduling", v1alpha1.DefaultSchedulerName, p.Status.Conditions[0].Message, 1, 90*time.Second, 90*time.Second))
	out, err := runPlugin(t, c, "nodes")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nodes-no-topology.txt", out)
	if !strings.Contains(out, "legacy") || !strings.Contains(out, "-/8") || !strings.Contains(out, "no-topology (the gputopo node agent has not published its GPUs)") {
		t.Errorf("nodes does not show legacy's advertised GPUs and missing topology:\n%s", out)
	}
	if strings.Contains(out, "0/0") {
		t.Errorf("nodes shows 0/0:\n%s", out)
	}
	out, err = runPlugin(t, c, "explain", "notebook")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "explain-no-topology.txt", out)
	if !regexp.MustCompile(`(?m)^legacy +fails .*gputopo: node has no NodeGPUTopology`).MatchString(out) {
		t.Errorf("explain does not give legacy the extender's reason:\n%s", out)
	}
	out, err = runPlugin(t, c, "nodes", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []NodeSummary
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Name == "legacy" && (r.Advertised != 8 || r.Status != StatusNoTopology) {
			t.Errorf("legacy: %+v", r)
		}
	}
}

// The plugin's selectors are ones kube-apiserver serves: the fake client
// fails a list whose field is not indexed, and the events of other
// objects never show.
func TestPodEventsSelectByUIDAndName(t *testing.T) {
	s := cluster(t)
	p := s.Pods[0]
	other := s.Pods[1]
	c := fakeCluster(t, s,
		event(&p, "Pod", corev1.EventTypeNormal, "GPUsBound", "gputopo-extender", "node v100: GPUs 0,1,2,3", 1, time.Minute, time.Minute),
		event(&other, "Pod", corev1.EventTypeWarning, "GPUAssignmentDrift", "gputopo-nodeagent", "kubelet allocated GPUs ...", 1, time.Minute, time.Minute))
	got := podEvents(context.Background(), c, now, &p)
	if got.Error != "" || len(got.Items) != 1 || got.Items[0].Reason != "GPUsBound" || got.Items[0].AgeSeconds != 60 {
		t.Errorf("events of %s: %+v", p.Name, got)
	}
}

// More than MaxEvents: the most recent ones, oldest first.
func TestEventViewsKeepTheMostRecent(t *testing.T) {
	var evs []corev1.Event
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "x", UID: "u"}}
	for i := 0; i < MaxEvents+3; i++ {
		e := event(p, "Pod", corev1.EventTypeWarning, "FailedScheduling", "s", "m", 1, time.Duration(100-i)*time.Second, time.Duration(100-i)*time.Second)
		e.Name = e.Name + string(rune('a'+i))
		evs = append(evs, *e)
	}
	got := eventViews(now, evs)
	if got.Omitted != 3 || len(got.Items) != MaxEvents || got.Items[0].AgeSeconds != 97 || got.Items[MaxEvents-1].AgeSeconds != 100-MaxEvents-2 {
		t.Errorf("kept %d (omitted %d), first age %d, last age %d", len(got.Items), got.Omitted, got.Items[0].AgeSeconds, got.Items[len(got.Items)-1].AgeSeconds)
	}
}

// A high-priority pod that fits nowhere now: explain names the pods
// preemption would evict on the node where that frees an NVLink quad (the
// DGX-1 V100, where the pod holding GPU 4 stands between the free 5-7 and
// a quad), none where no eviction helps (the PCIe box), and none for a
// pod that may not preempt or outranks nobody.
func TestExplainSaysWhatPreemptionWouldEvict(t *testing.T) {
	s := cluster(t)
	high := pendingPod("high", v1alpha1.DefaultSchedulerName, 4, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`})
	prio := int32(1000)
	high.Spec.Priority = &prio
	never := *high.DeepCopy()
	never.Name, never.UID = "never", "uid-never"
	policy := corev1.PreemptNever
	never.Spec.PreemptionPolicy = &policy
	peer := *high.DeepCopy()
	peer.Name, peer.UID, peer.Spec.Priority = "peer", "uid-peer", nil
	s.Pods = append(s.Pods, high, never, peer)
	c := fakeCluster(t, s)
	preempt := func(name string) map[string][]string {
		t.Helper()
		out, err := runPlugin(t, c, "explain", name, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var e Explanation
		if err := json.Unmarshal([]byte(out), &e); err != nil {
			t.Fatal(err)
		}
		got := map[string][]string{}
		for _, v := range e.Nodes {
			if len(v.Preempt) > 0 {
				got[v.Node] = v.Preempt
			}
		}
		return got
	}
	if got, want := preempt("high"), map[string][]string{"v100": {"team/drifted"}}; !cmp.Equal(got, want) {
		t.Errorf("high: preemption %v, want %v", got, want)
	}
	out, err := runPlugin(t, c, "explain", "high")
	if err != nil {
		t.Fatal(err)
	}
	if want := "Preemption on v100 would evict 1 pod(s) of lower priority whose GPUs the pod needs: team/drifted"; !strings.Contains(out, want) {
		t.Errorf("explain lacks %q:\n%s", want, out)
	}
	for _, name := range []string{"never", "peer"} {
		if got := preempt(name); len(got) != 0 {
			t.Errorf("%s: preemption %v, want none", name, got)
		}
	}
}
