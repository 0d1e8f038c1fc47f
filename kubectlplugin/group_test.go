package kubectlplugin

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

const leafLabel = "network.topology.nvidia.com/leaf"

// groupCluster: three empty DGX A100s, a100-1 and a100-2 under leaf l1,
// a100-3 under leaf l2, and the pods of group team/train (size pods of 8
// GPUs, model-parallel: preferred nvlink), none bound; extra annotations
// go on every one of them.
func groupCluster(t *testing.T, size, pods int, extra map[string]string) *Snapshot {
	s := &Snapshot{Now: now, Config: configv1alpha1.DefaultExtenderConfiguration(), ConfigSource: "defaults"}
	for _, n := range []struct{ name, leaf string }{{"a100-1", "l1"}, {"a100-2", "l1"}, {"a100-3", "l2"}} {
		s.Topologies = append(s.Topologies, topo(t, "dgx-a100", n.name, now))
		s.Nodes = append(s.Nodes, node(n.name, 8, map[string]string{leafLabel: n.leaf}))
	}
	for i := 0; i < pods; i++ {
		ann := map[string]string{v1alpha1.AnnotationGroup: "train", v1alpha1.AnnotationGroupSize: itoa(size),
			v1alpha1.AnnotationGroupPreferredTopology: "nvlink", v1alpha1.AnnotationParallelism: "model"}
		for k, v := range extra {
			ann[k] = v
		}
		s.Pods = append(s.Pods, pendingPod("train-"+itoa(i), v1alpha1.DefaultSchedulerName, 8, ann))
	}
	s.sort()
	return s
}

func itoa(i int) string { return strconv.Itoa(i) }

// bind makes pod name bound on node with the placement record a group
// member's bind writes.
func bind(t *testing.T, s *Snapshot, name, node, domain string) {
	t.Helper()
	p := s.pod("team", name)
	p.Spec.NodeName = node
	p.Status.Phase = "Running"
	p.Annotations[v1alpha1.AnnotationAssignedGPUs] = uuids(node, 0, 1, 2, 3, 4, 5, 6, 7)
	p.Annotations[v1alpha1.AnnotationPlacement] = v1alpha1.Placement{Node: node, Strategy: v1alpha1.StrategyHighestBandwidth,
		GPUIndices: []int{0, 1, 2, 3, 4, 5, 6, 7}, Tier: v1alpha1.TierNVSwitch, MinPairBandwidthGBps: 600, RingBandwidthGBps: 600, Group: "team/train", Domain: domain}.String()
}

// The pods table has GROUP and DOMAIN columns once a pod is in a group:
// the record's domain for a bound pod, "-" for a pending one.
func TestPodsTableShowsGroupAndDomain(t *testing.T) {
	s := groupCluster(t, 2, 2, nil)
	bind(t, s, "train-0", "a100-1", leafLabel+"=l1")
	s.Pods = append(s.Pods, pod("alone", "a100-3", 1, map[string]string{v1alpha1.AnnotationAssignedGPUs: uuids("a100-3", 0)}))
	s.sort()
	rows := s.PodRows()
	got := map[string][2]string{}
	for _, r := range rows {
		got[r.Name] = [2]string{r.Group, r.Domain}
	}
	want := map[string][2]string{"train-0": {"team/train", leafLabel + "=l1"}, "train-1": {"team/train", ""}, "alone": {"", ""}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("groups and domains (-want +got):\n%s", diff)
	}
	out, err := runPlugin(t, fakeCluster(t, s), "pods")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "pods-group.txt", out)
	lines := strings.Split(out, "\n")
	if !strings.Contains(lines[0], "GROUP") || !strings.Contains(lines[0], "DOMAIN") {
		t.Fatalf("no GROUP and DOMAIN columns:\n%s", out)
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		switch {
		case len(f) == 0:
		case f[0] == "team/train-0":
			if f[5] != "team/train" || f[6] != leafLabel+"=l1" {
				t.Errorf("bound member: %q", l)
			}
		case f[0] == "team/train-1":
			if f[5] != "team/train" || f[6] != "-" {
				t.Errorf("pending member: %q", l)
			}
		case f[0] == "team/alone":
			if f[5] != "-" || f[6] != "-" {
				t.Errorf("pod of no group: %q", l)
			}
		}
	}

	// Without a group, the table keeps its columns.
	out, err = runPlugin(t, fakeCluster(t, cluster(t)), "pods")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "GROUP") || strings.Contains(out, "DOMAIN") {
		t.Errorf("a cluster without groups shows group columns:\n%s", out)
	}
}

// A pod whose group annotations do not parse is shown as such; a group
// of one pod is an ordinary pod.
func TestPodsTableMarksAnInvalidGroupAndIgnoresAGroupOfOne(t *testing.T) {
	s := groupCluster(t, 1, 1, nil)
	bad := pendingPod("bad", v1alpha1.DefaultSchedulerName, 1, map[string]string{v1alpha1.AnnotationGroup: "Not_A_Label"})
	s.Pods = append(s.Pods, bad)
	s.sort()
	for _, r := range s.PodRows() {
		switch r.Name {
		case "bad":
			if r.Group != groupInvalid {
				t.Errorf("bad: group %q, want %q", r.Group, groupInvalid)
			}
		case "train-0":
			if r.Group != "" {
				t.Errorf("a group of one: group %q, want none", r.Group)
			}
		}
	}
}

// A pending pod whose group fits: explain says the domain and the nodes
// the core's own group planning picks, the tightest level that holds the
// group (no NVLink domain spans nodes here, so a leaf), and per node
// where the plan puts the pod.
func TestExplainGroupThatFits(t *testing.T) {
	s := groupCluster(t, 2, 2, nil)
	e, err := s.Explain("team", "train-1")
	if err != nil {
		t.Fatal(err)
	}
	g := e.Group
	if g == nil {
		t.Fatal("no group in explain")
	}
	if g.Name != "team/train" || g.Size != 2 || g.Preferred != "nvlink" || g.Wait != "" || g.Bound() != 0 || len(g.Members) != 2 {
		t.Errorf("group %+v", g)
	}
	if g.Domain != leafLabel+"=l1" || g.Level != "leaf" {
		t.Errorf("domain %q level %q; want %s=l1, leaf", g.Domain, g.Level, leafLabel)
	}
	if got := slices.Sorted(slices.Values(g.Nodes)); !slices.Equal(got, []string{"a100-1", "a100-2"}) {
		t.Errorf("nodes %v; want a100-1 and a100-2", g.Nodes)
	}
	var out bytes.Buffer
	if err := writeExplanation(&out, painter{}, e); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"group:        team/train, 2 pods placed together, all or nothing, in one fabric domain, preferred nvlink",
		"members:      0 bound, 2 pending (train-0, train-1)",
		"domain:       " + leafLabel + "=l1 (leaf): its 2 pod(s) not bound yet go to a100-",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, out.String())
		}
	}
}

// A group that cannot be placed: explain says why in the scheduler's
// words, the same words every node's verdict carries.
func TestExplainGroupThatWaits(t *testing.T) {
	// 2 x 8 GPUs in one leaf while a100-1 (leaf l1, with a100-2) is busy:
	// it fits once a100-1 frees, so every node fails now, not never.
	s := groupCluster(t, 2, 2, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
	s.Pods = append(s.Pods, pod("busy", "a100-1", 8, map[string]string{v1alpha1.AnnotationAssignedGPUs: uuids("a100-1", 0, 1, 2, 3, 4, 5, 6, 7)}))
	s.sort()
	out, err := runPlugin(t, fakeCluster(t, s), "explain", "train-1")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "explain-group-waits.txt", out)
	const why = "group team/train needs 2 pods × 8 GPUs in one leaf domain; the largest free holds 1"
	if !strings.Contains(out, "waits:        "+why) || !strings.Contains(out, "required leaf, preferred nvlink") {
		t.Errorf("explain does not say why the group waits:\n%s", out)
	}
	e, err := s.Explain("team", "train-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range e.Nodes {
		if v.Verdict != VerdictFails || !strings.Contains(v.Reason, why) {
			t.Errorf("node %s: %s %q; want fails with the group's reason", v.Node, v.Verdict, v.Reason)
		}
	}

	// 3 x 8 GPUs in one leaf: no leaf has three nodes, so never.
	s = groupCluster(t, 3, 3, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
	e, err = s.Explain("team", "train-2")
	if err != nil {
		t.Fatal(err)
	}
	const never = "group team/train needs 3 pods × 8 GPUs in one leaf domain; none holds that many even with every GPU free (the largest holds 2)"
	if e.Group == nil || !strings.Contains(e.Group.Wait, never) {
		t.Errorf("group %+v; want it to wait with %q", e.Group, never)
	}
	for _, v := range e.Nodes {
		if v.Verdict != VerdictNever || !strings.Contains(v.Reason, never) {
			t.Errorf("node %s: %s %q; want never with the group's reason", v.Node, v.Verdict, v.Reason)
		}
	}

	// Two of three pods exist: the group waits for the third.
	s = groupCluster(t, 3, 2, nil)
	e, err = s.Explain("team", "train-0")
	if err != nil {
		t.Fatal(err)
	}
	if e.Group == nil || e.Group.Wait != "group team/train waits for its pods: 2 of 3 exist" {
		t.Errorf("group %+v; want it waiting for its pods", e.Group)
	}
	var b bytes.Buffer
	if err := writeExplanation(&b, painter{}, e); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "members:      0 bound, 2 pending (train-0, train-1), 1 not created yet") {
		t.Errorf("explain does not count the missing pod:\n%s", b.String())
	}
}

// A bound member: its group's domain is its placement record's; the
// member still pending goes into the same domain.
func TestExplainBoundGroupMember(t *testing.T) {
	s := groupCluster(t, 2, 2, nil)
	bind(t, s, "train-0", "a100-2", leafLabel+"=l1")
	out, err := runPlugin(t, fakeCluster(t, s), "explain", "train-0", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var e Explanation
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatal(err)
	}
	if e.Bound == nil || e.Bound.Placement == nil || e.Bound.Placement.Domain != leafLabel+"=l1" {
		t.Errorf("bound %+v; want the record's domain", e.Bound)
	}
	want := []GroupMember{{Name: "train-0", Node: "a100-2", Domain: leafLabel + "=l1"}, {Name: "train-1"}}
	if e.Group == nil || !cmp.Equal(e.Group.Members, want) {
		t.Fatalf("group %+v; want members %+v", e.Group, want)
	}
	// train-1 can only join train-0's leaf: a100-1.
	if e.Group.Domain != leafLabel+"=l1" || !slices.Equal(e.Group.Nodes, []string{"a100-1"}) {
		t.Errorf("group domain %q nodes %v; want l1, a100-1", e.Group.Domain, e.Group.Nodes)
	}

	// Both bound: where the records say.
	bind(t, s, "train-1", "a100-1", leafLabel+"=l1")
	ex, err := s.Explain("team", "train-1")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := writeExplanation(&b, painter{}, ex); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"members:      2 bound (train-1 on a100-1, train-0 on a100-2), 0 pending", "domain:       " + leafLabel + "=l1 (its bound pods' placement record)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("explain lacks %q:\n%s", want, b.String())
		}
	}
}

// A pod outside groups on labelled nodes: the empty nodes score alike, so
// the one in the fuller leaf keeps 10 (a100-2: a100-1 beside it is busy,
// l1 has 8 free GPUs) and explain gives the nodes it passed over (a100-3
// and a100-4, l2: 16 free) that reason.
func TestExplainSaysWhichNodeDomainPackingPassedOver(t *testing.T) {
	s := groupCluster(t, 2, 0, nil)
	s.Topologies = append(s.Topologies, topo(t, "dgx-a100", "a100-4", now))
	s.Nodes = append(s.Nodes, node("a100-4", 8, map[string]string{leafLabel: "l2"}))
	s.Pods = append(s.Pods, pod("busy", "a100-1", 8, map[string]string{v1alpha1.AnnotationAssignedGPUs: uuids("a100-1", 0, 1, 2, 3, 4, 5, 6, 7)}),
		pendingPod("one", v1alpha1.DefaultSchedulerName, 1, map[string]string{}))
	s.sort()
	e, err := s.Explain("team", "one")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]NodeVerdict{}
	for _, v := range e.Nodes {
		got[v.Node] = v
	}
	if v := got["a100-2"]; v.Verdict != VerdictFits || v.Score != 10 || v.Reason != "" {
		t.Errorf("a100-2 (the fuller leaf) %+v; want fits, 10, no reason", v)
	}
	for _, n := range []string{"a100-3", "a100-4"} {
		if v := got[n]; v.Verdict != VerdictFits || v.Score != 9 || v.Reason != ReasonPackedOver {
			t.Errorf("%s %+v; want fits, 9, %q", n, v, ReasonPackedOver)
		}
	}
}

// A sliced group's bound pod shows its slice and the slice's domain in
// the DOMAIN column and in explain's members, beside the group's domain in
// the JSON rows.
func TestPodsTableShowsEachPodsSlice(t *testing.T) {
	s := groupCluster(t, 2, 2, map[string]string{v1alpha1.AnnotationSliceSize: "1", v1alpha1.AnnotationSliceRequiredTopology: "nvlink"})
	bind(t, s, "train-0", "a100-1", leafLabel+"=l1")
	p := s.pod("team", "train-0")
	pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	pl.Slice, pl.SliceDomain = 1, "node=a100-1"
	p.Annotations[v1alpha1.AnnotationPlacement] = pl.String()
	rows := s.PodRows()
	for _, r := range rows {
		if r.Name == "train-0" && (r.Slice != 1 || r.SliceDomain != "node=a100-1" || r.Domain != leafLabel+"=l1") {
			t.Errorf("row %+v: want slice 1 in node=a100-1 of the group's domain %s=l1", r, leafLabel)
		}
	}
	out, err := runPlugin(t, fakeCluster(t, s), "pods")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "slice 1: node=a100-1") {
		t.Errorf("pods table does not show the pod's slice:\n%s", out)
	}
	out, err = runPlugin(t, fakeCluster(t, s), "explain", "train-1", "-n", "team")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"in slices of 1 pods, each inside one nvlink domain", "train-0 on a100-1 (slice 1 in node=a100-1)"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain does not say %q:\n%s", want, out)
		}
	}
}
