package kubectlplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	topomachine "github.com/gputopo/gputopo/topology/machine"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

// now is the tests' clock: the views measure ages from it, so the golden
// files do not change with the clock. (The extender core judges topology
// freshness by the real clock, a few milliseconds later.) Whole seconds, as
// the API stores times.
var now = time.Now().Truncate(time.Second)

func topo(t *testing.T, fixture, node string, observed time.Time) v1alpha1.NodeGPUTopology {
	t.Helper()
	f, err := topomachine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	st := f.Graph(node).Status()
	st.ObservedTime = metav1.NewTime(observed)
	return v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

func node(name string, gpus int64, labels map[string]string) corev1.Node {
	return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Status: corev1.NodeStatus{
		Allocatable: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}}}
}

func pod(name, nodeName string, gpus int64, ann map[string]string) corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: k8stypes.UID("uid-" + name), Annotations: ann},
		Spec: corev1.PodSpec{NodeName: nodeName, SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{Name: "main",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{v1alpha1.ResourceGPU: q}, Limits: corev1.ResourceList{v1alpha1.ResourceGPU: q}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func uuids(node string, idx ...int) string {
	out := make([]string, len(idx))
	for i, g := range idx {
		out[i] = topomachine.FixtureUUID(node, g)
	}
	return strings.Join(out, ",")
}

// cluster: a DGX-1 V100 whose quad {0,1,2,3} is held and whose GPU 4 is
// held by a pod whose truth differs from its plan (drift); an empty DGX
// A100 whose topology is older than topologyMaxAge; a PCIe box.
func cluster(t *testing.T) *Snapshot {
	s := &Snapshot{Now: now, Config: configv1alpha1.DefaultExtenderConfiguration(), ConfigSource: "defaults"}
	s.Topologies = []v1alpha1.NodeGPUTopology{
		topo(t, "dgx1-v100", "v100", now),
		topo(t, "dgx-a100", "a100", now.Add(-time.Hour)),
		topo(t, "pcie-8x", "pcie", now),
	}
	s.Nodes = []corev1.Node{node("a100", 8, nil), node("pcie", 8, map[string]string{"pool": "pcie"}), node("v100", 8, nil)}
	s.Pods = []corev1.Pod{
		pod("quad", "v100", 4, map[string]string{v1alpha1.AnnotationAssignedGPUs: uuids("v100", 0, 1, 2, 3),
			v1alpha1.AnnotationPlacement: `{"node":"v100","strategy":"highest_bandwidth","gpuIndices":[0,1,2,3],"tier":"nvlink","minPairBandwidthGBps":50,"ringBandwidthGBps":100,"score":7}`}),
		pod("drifted", "v100", 1, map[string]string{v1alpha1.AnnotationAssignedGPUs: uuids("v100", 5), v1alpha1.AnnotationAllocatedGPUs: uuids("v100", 4)}),
	}
	s.sort()
	return s
}

func TestNodeSummariesCountFreeIslandsDriftAndStaleness(t *testing.T) {
	got := cluster(t).NodeSummaries()
	for i := range got {
		got[i].ObservedTime, got[i].AgeSeconds = nil, 0
	}
	want := []NodeSummary{
		{Name: "a100", Machine: "8x NVIDIA A100-SXM4-40GB, NVSwitch", GPUs: 8, Advertised: 8, Free: 8, LargestFreeNVLinkIsland: 8, Status: StatusStale, StaleReason: "not refreshed for more than 15m0s (topologyMaxAge)"},
		{Name: "pcie", Machine: "8x NVIDIA L40S, PCIe", GPUs: 8, Advertised: 8, Free: 8, LargestFreeNVLinkIsland: 1, Status: StatusFresh},
		// GPU 4 is held (truth), 5 is free again; {5,6,7} is not a full
		// NVLink clique on the cube-mesh: 5-6 and 5-7 and 6-7 are links,
		// so the island is 3.
		{Name: "v100", Machine: "8x Tesla V100-SXM2-16GB, NVLink", GPUs: 8, Advertised: 8, Free: 3, LargestFreeNVLinkIsland: 3, Drift: 1, Status: StatusFresh},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("node summaries (-want +got):\n%s", diff)
	}
}

// explain's reasons are the extender's Filter's, word for word, and the
// GPUs of a passing node are the ones its allocator picks.
func TestExplainPendingPodUsesTheExtendersVerdicts(t *testing.T) {
	s := cluster(t)
	p := pod("big", "", 4, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`})
	p.Status.Phase = corev1.PodPending
	p.Spec.NodeSelector = map[string]string{"pool": "pcie"}
	s.Pods = append(s.Pods, p)
	s.sort()
	e, err := s.Explain("team", "big")
	if err != nil {
		t.Fatal(err)
	}
	x, err := placement.New(placement.Options{Config: s.Config})
	if err != nil {
		t.Fatal(err)
	}
	for i := range s.Topologies {
		x.Feed().UpsertTopology(&s.Topologies[i])
	}
	for i := range s.Nodes {
		x.Feed().UpsertNode(&s.Nodes[i])
	}
	for i := range s.Pods {
		x.Feed().UpsertPod(&s.Pods[i])
	}
	names := []string{"a100", "pcie", "v100"}
	pr, err := placement.ParseRequest(&p, s.Config.GPUResource(), x.Now())
	if err != nil {
		t.Fatal(err)
	}
	res, err := x.Filter(context.Background(), pr, names)
	if err != nil {
		t.Fatal(err)
	}
	byNode := map[string]NodeVerdict{}
	for _, v := range e.Nodes {
		byNode[v.Node] = v
	}
	for _, n := range names {
		want := res.Failed[n] + res.Unresolvable[n]
		if byNode[n].Reason != want {
			t.Errorf("node %s: explain reason %q, extender filter %q", n, byNode[n].Reason, want)
		}
	}
	if v := byNode["pcie"]; v.Verdict != VerdictNever || v.Scheduler != "" {
		t.Errorf("pcie: %+v; want never (no NVLink at all) and kube-scheduler ok (the selector matches)", v)
	}
	if v := byNode["a100"]; v.Verdict != VerdictFails || !strings.Contains(v.Reason, "not refreshed") || !strings.Contains(v.Scheduler, "nodeSelector") {
		t.Errorf("a100: %+v; want fails (stale topology) and the selector mismatch", v)
	}
	if e.RequestedTier != string(v1alpha1.TierNVLink) || e.Strategy != string(v1alpha1.StrategyHighestBandwidth) {
		t.Errorf("requested %q strategy %q", e.RequestedTier, e.Strategy)
	}

	// Without the selector and with a fresh A100, the A100 fits with 4
	// NVSwitch GPUs and comes first.
	s.Topologies[0].Status.ObservedTime = metav1.NewTime(now)
	for i := range s.Pods {
		s.Pods[i].Spec.NodeSelector = nil
	}
	e, err = s.Explain("team", "big")
	if err != nil {
		t.Fatal(err)
	}
	if v := e.Nodes[0]; v.Node != "a100" || v.Verdict != VerdictFits || len(v.GPUs) != 4 || v.Tier != string(v1alpha1.TierNVSwitch) || v.RingBandwidthGBps != 600 {
		t.Errorf("best node %+v; want a100 fitting 4 NVSwitch GPUs at 600 GB/s", v)
	}
}

func TestExplainBoundPodComparesPlanAndTruth(t *testing.T) {
	s := cluster(t)
	for _, tc := range []struct {
		name, pod, truth, tier string
	}{
		{name: "plan without truth yet", pod: "quad", truth: TruthNotRecorded, tier: "nvlink"},
		{name: "truth differs from plan", pod: "drifted", truth: TruthDrift, tier: "single-gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := s.Explain("team", tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			if e.Bound == nil || e.Bound.Truth != tc.truth || e.Bound.AchievedTier != tc.tier || !e.Bound.Met {
				t.Errorf("bound view %+v; want truth %s, achieved tier %s, requirement met", e.Bound, tc.truth, tc.tier)
			}
		})
	}
}

func TestNodeDetailShowsHoldersGroupsAndLinks(t *testing.T) {
	d, err := cluster(t).NodeDetail("v100")
	if err != nil {
		t.Fatal(err)
	}
	if got := d.GPUList[4].Holders; !slices.Equal(got, []string{"team/drifted"}) {
		t.Errorf("GPU 4 held by %v; want the drifted pod (truth over plan)", got)
	}
	if d.GPUList[5].Holders != nil {
		t.Errorf("GPU 5 held by %v; its pod's truth is GPU 4", d.GPUList[5].Holders)
	}
	// DGX-1: PCIe switches {0,1},{2,3},{4,5},{6,7}.
	var groups []int
	for _, g := range d.GPUList {
		groups = append(groups, g.PCIeGroup)
	}
	if want := []int{0, 0, 1, 1, 2, 2, 3, 3}; !slices.Equal(groups, want) {
		t.Errorf("PCIe groups %v; want %v", groups, want)
	}
	if len(d.Links) != 28 {
		t.Errorf("%d links; want 28 pairs", len(d.Links))
	}
	var out bytes.Buffer
	if err := writeNode(&out, painter{}, d); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NV2 100", "NV1 50", "SYS ", "team/drifted", "GPU7"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("node picture lacks %q:\n%s", want, out.String())
		}
	}
}

func TestColourOnlyWhenAsked(t *testing.T) {
	for _, tc := range []struct {
		color string
		want  bool
	}{
		{"auto", false}, // a buffer is not a terminal
		{"never", false},
		{"always", true},
	} {
		t.Run(tc.color, func(t *testing.T) {
			var out bytes.Buffer
			o := &Options{Out: &out, Color: tc.color}
			if got := o.painter().on; got != tc.want {
				t.Errorf("colour %v; want %v", got, tc.want)
			}
		})
	}
}

func TestTableAlignsColouredCells(t *testing.T) {
	var out bytes.Buffer
	p := painter{on: true}
	tb := newTable(&out)
	tb.Write([]byte("A\tB\n" + p.c(red, "x") + "\ty\nlonger\tz\n"))
	if err := tb.Flush(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(ansi.ReplaceAllString(out.String(), ""), "\n")
	for _, l := range lines[:3] {
		if strings.Index(l, l[len(l)-1:]) != 8 {
			t.Errorf("line %q: last column not at 8", l)
		}
	}
}

func TestCommandOutputsJSONAndRejectsBadFlags(t *testing.T) {
	c := fakeCluster(t, cluster(t))
	run := func(args ...string) (string, error) { return runPlugin(t, c, args...) }
	out, err := run("pods", "-A", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []PodRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("pods -o json: %v\n%s", err, out)
	}
	if len(rows) != 2 || rows[0].Name != "quad" || !rows[1].Drift {
		t.Errorf("pods: %+v; want quad then the drifted pod", rows)
	}
	for _, args := range [][]string{{"nodes", "-o", "wide"}, {"nodes", "--color", "sometimes"}, {"node", "nosuch"}, {"explain", "team/nosuch"},
		{"explain"}, {"explain", "quad", "--job", "train"}, {"explain", "--job", "nosuch"}} {
		if _, err := run(args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

// A placement that fell back (fallbackAfter) is shown with its reason.
func TestExplainShowsAFallBack(t *testing.T) {
	s := cluster(t)
	s.Pods[1].Annotations[v1alpha1.AnnotationPlacement] = `{"node":"v100","strategy":"highest_bandwidth","gpuIndices":[0,1,2,3],"tier":"nvlink","minPairBandwidthGBps":50,"ringBandwidthGBps":100,"score":7,"degraded":true,"degradedReason":"Pending longer than fallbackAfter 30m0s"}`
	e, err := s.Explain("team", s.Pods[1].Name)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := writeExplanation(&out, painter{}, e); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "fell back: Pending longer than fallbackAfter 30m0s") {
		t.Errorf("explain does not show the fall-back:\n%s", out.String())
	}
}

// A topology that its Node's GPU counts contradict is shown untrusted,
// with the extender's reason, as filter refuses it.
func TestNodeSummaryShowsATopologyItsNodeContradicts(t *testing.T) {
	s := cluster(t)
	for i := range s.Nodes {
		n := &s.Nodes[i]
		capacity := int64(8)
		if n.Name == "pcie" {
			capacity = 4
			n.Status.Allocatable[v1alpha1.ResourceGPU] = *resource.NewQuantity(4, resource.DecimalSI)
		}
		n.Status.Capacity = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(capacity, resource.DecimalSI)}
	}
	for _, r := range s.NodeSummaries() {
		switch r.Name {
		case "pcie":
			want := "node's NodeGPUTopology lists 8 GPUs but the Node advertises capacity 4 nvidia.com/gpu; the topology is not trusted until they agree"
			if r.Status != StatusUntrusted || !strings.HasPrefix(r.StaleReason, want) {
				t.Errorf("pcie: status %q reason %q; want %q with %q", r.Status, r.StaleReason, StatusUntrusted, want)
			}
		case "v100":
			if r.Status != StatusFresh {
				t.Errorf("v100, whose counts agree: status %q (%s), want fresh", r.Status, r.StaleReason)
			}
		}
	}
}

// nodes and node show the GPUs the scheduler plans for a group's pods (not
// free any more) and those it keeps for a waiting group, naming the group
// and since when, from its GroupPlan objects.
func TestNodesShowPlannedAndKeptGPUs(t *testing.T) {
	s := cluster(t)
	since := metav1.NewTime(now.Add(-2 * time.Minute))
	planned := &v1alpha1.GroupPlan{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "llm"}, Spec: v1alpha1.GroupPlanSpec{
		State: v1alpha1.GroupPlanned, Since: since, Slots: []v1alpha1.GroupPlanSlot{{Node: "pcie", GPUs: []int{0, 1, 2, 3}}}}}
	kept := &v1alpha1.GroupPlan{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "big"}, Spec: v1alpha1.GroupPlanSpec{
		State: v1alpha1.GroupKept, Since: since, Slots: []v1alpha1.GroupPlanSlot{{Node: "pcie", GPUs: []int{6, 7}}}}}
	c := fakeCluster(t, s, planned, kept)
	out, err := runPlugin(t, c, "nodes", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rows []NodeSummary
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatal(err)
	}
	var pcie NodeSummary
	for _, r := range rows {
		if r.Name == "pcie" {
			pcie = r
		}
	}
	stamp := since.UTC().Format(time.RFC3339)
	want := []string{"team/big kept 2 since " + stamp, "team/llm planned 4 since " + stamp}
	if pcie.Free != 4 || pcie.Planned != 4 || pcie.Kept != 2 || !slices.Equal(pcie.HeldFor, want) {
		t.Errorf("pcie: free %d, planned %d, kept %d, for %v; want 4, 4, 2, %v", pcie.Free, pcie.Planned, pcie.Kept, pcie.HeldFor, want)
	}
	text, err := runPlugin(t, c, "node", "pcie")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"planned for team/llm since " + stamp, "free, kept for team/big since " + stamp} {
		if !strings.Contains(text, want) {
			t.Errorf("node pcie lacks %q:\n%s", want, text)
		}
	}
}

// claimCluster: a DGX-1 V100 node whose GPUs a DRA driver publishes (no
// nvidia.com/gpu), a pod whose claim is allocated GPUs 4-7 and a Pending
// pod whose claim asks for 2.
func claimCluster(t *testing.T) *Snapshot {
	s := &Snapshot{Now: now, Config: configv1alpha1.DefaultExtenderConfiguration(), ConfigSource: "defaults"}
	s.Topologies = []v1alpha1.NodeGPUTopology{topo(t, "dgx1-v100", "dra", now)}
	s.Nodes = []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "dra"}}}
	var devices []resourcev1.Device
	for i := range 8 {
		u := topomachine.FixtureUUID("dra", i)
		devices = append(devices, resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": {StringValue: &u}}})
	}
	nodeName := "dra"
	s.Slices = []resourcev1.ResourceSlice{{ObjectMeta: metav1.ObjectMeta{Name: "dra-gpus"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "gpu.nvidia.com", NodeName: &nodeName, Pool: resourcev1.ResourcePool{Name: "dra", ResourceSliceCount: 1}, Devices: devices}}}
	claim := func(name string, count int64, alloc ...int) resourcev1.ResourceClaim {
		c := resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}, Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com", Count: count}}}}}}
		if alloc != nil {
			c.Status.Allocation = &resourcev1.AllocationResult{}
			for _, i := range alloc {
				c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourcev1.DeviceRequestAllocationResult{
					Request: "gpus", Driver: "gpu.nvidia.com", Pool: "dra", Device: fmt.Sprintf("gpu-%d", i)})
			}
		}
		return c
	}
	s.Claims = []resourcev1.ResourceClaim{claim("quad-gpus", 4, 4, 5, 6, 7), claim("pair-gpus", 2)}
	claimPod := func(name, nodeName string) corev1.Pod {
		p := pod(name, nodeName, 0, nil)
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name + "-gpus")}}
		return p
	}
	pending := claimPod("pair", "")
	pending.Status.Phase = corev1.PodPending
	s.Pods = []corev1.Pod{claimPod("quad", "dra"), pending}
	s.sort()

	return s
}

// A DGX-1 V100 node whose GPUs a DRA driver publishes (no nvidia.com/gpu),
// a pod whose claim is allocated GPUs 4-7 and a Pending pod whose claim
// asks for 2: the pods view shows each with its claim and the bound one's
// GPUs, tier and ring from the allocation; the nodes view counts the four
// as held; the node view names the claim beside the pod.
func TestClaimPodsShowTheirClaimsAndGPUs(t *testing.T) {
	s := claimCluster(t)
	rows := s.PodRows()
	if len(rows) != 2 {
		t.Fatalf("pod rows %+v; want the two claim pods", rows)
	}
	if r := rows[0]; r.Name != "quad" || r.Requested != 4 || !slices.Equal(r.GPUs, []int{4, 5, 6, 7}) || !slices.Equal(r.Claims, []string{"team/quad-gpus"}) || r.Tier != string(v1alpha1.TierNVLink) || r.RingBandwidthGBps == 0 {
		t.Errorf("bound claim pod's row %+v; want 4 requested, GPUs 4-7 on NVLink, its claim", r)
	}
	if r := rows[1]; r.Name != "pair" || r.Requested != 2 || r.GPUs != nil || !slices.Equal(r.Claims, []string{"team/pair-gpus"}) {
		t.Errorf("pending claim pod's row %+v; want 2 requested, no GPUs, its claim", r)
	}
	var out bytes.Buffer
	if err := writePods(&out, painter{}, rows, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CLAIMS", "team/quad-gpus", "claim"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("pods table lacks %q:\n%s", want, out.String())
		}
	}
	if sum := s.NodeSummaries(); len(sum) != 1 || sum[0].Free != 4 || sum[0].Status != StatusFresh {
		t.Errorf("node summaries %+v; want dra fresh with 4 free", sum)
	}
	d, err := s.NodeDetail("dra")
	if err != nil {
		t.Fatal(err)
	}
	if got := d.GPUList[6].Holders; !slices.Equal(got, []string{"team/quad (claim team/quad-gpus)"}) {
		t.Errorf("GPU 6 held by %v; want the pod with its claim", got)
	}
}

// explain of a Pending claim pod runs the decision core with its claims'
// count and the GPUs other claims hold; of a bound one, it compares the
// plan with the claims' allocation.
func TestExplainClaimPods(t *testing.T) {
	s := claimCluster(t)
	e, err := s.Explain("team", "pair")
	if err != nil {
		t.Fatal(err)
	}
	if e.Requested != 2 || len(e.Nodes) != 1 || e.Nodes[0].Verdict != VerdictFits || len(e.Nodes[0].GPUs) != 2 || slices.ContainsFunc(e.Nodes[0].GPUs, func(i int) bool { return i >= 4 }) {
		t.Errorf("explain of the Pending claim pod: requested %d, verdicts %+v; want 2 GPUs that fit outside the claimed 4-7", e.Requested, e.Nodes)
	}
	e, err = s.Explain("team", "quad")
	if err != nil {
		t.Fatal(err)
	}
	if b := e.Bound; b == nil || !slices.Equal(b.Claims, []string{"team/quad-gpus"}) || len(b.Allocated) != 4 || b.Truth != TruthNoPlan || b.AchievedTier != string(v1alpha1.TierNVLink) {
		t.Errorf("explain of the bound claim pod: %+v; want its claim's 4 GPUs on NVLink, no plan", e.Bound)
	}
	var out bytes.Buffer
	if err := writeExplanation(&out, painter{}, e); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "claims:    team/quad-gpus") {
		t.Errorf("explain lacks the claim:\n%s", out.String())
	}
}
