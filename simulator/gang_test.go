package simulator

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

func TestParseClusterPlacesNodesInAFabric(t *testing.T) {
	type lab struct{ Name, Clique, GPUClique, Leaf, Spine string }
	want := []lab{
		{"gb200-nvl72-tray-0", "gb200-nvl72-tray-rack-0.1", "gb200-nvl72-tray-rack-0.1", "leaf-0", "spine-0"},
		{"gb200-nvl72-tray-1", "gb200-nvl72-tray-rack-0.1", "gb200-nvl72-tray-rack-0.1", "leaf-0", "spine-0"},
		{"gb200-nvl72-tray-2", "gb200-nvl72-tray-rack-1.1", "gb200-nvl72-tray-rack-1.1", "leaf-0", "spine-0"},
		{"gb200-nvl72-tray-3", "gb200-nvl72-tray-rack-1.1", "gb200-nvl72-tray-rack-1.1", "leaf-0", "spine-0"},
		{"hgx-h100-0", "", "", "leaf-1", "spine-0"},
		{"hgx-h100-1", "", "", "leaf-1", "spine-0"},
		{"hgx-h100-2", "", "", "leaf-2", "spine-1"},
		{"pcie-8x-0", "", "", "leaf-3", "spine-1"},
	}
	nodes := mustCluster(t, "gb200-nvl72-tray=4/rack=2/leaf=4,hgx-h100=3/leaf=2,pcie-8x=1/leaf=1;spine=2")
	var got []lab
	for _, n := range nodes {
		got = append(got, lab{n.Name, n.Labels[LabelClique], n.Graph.GPU(0).FabricClique, n.Labels[LabelLeaf], n.Labels[LabelSpine]})
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if nodes[0].Graph.Hash() != nodes[2].Graph.Hash() {
		t.Error("two racks' trays have different topology hashes; the clique must not enter the hash")
	}
	for spec, want := range map[string]string{
		"hgx-h100=3/leaf=2,pcie-8x=1;spine=2": "needs leaf=L on every entry",
		"hgx-h100=2/row=1":                    "want rack=R",
		"hgx-h100=2/leaf=0":                   "want rack=R",
		"hgx-h100=2;pod=1":                    "want spine=S",
	} {
		if _, err := ParseCluster(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCluster(%q) error %v, want one containing %q", spec, err, want)
		}
	}
	// Plain specs carry no labels: the placement suite's clusters are as
	// they were.
	for _, n := range mustCluster(t, ClusterMixed) {
		if n.Labels != nil {
			t.Fatalf("%s has labels %v", n.Name, n.Labels)
		}
	}
}

func TestGangTracesAreSeededAndRoundTrip(t *testing.T) {
	for _, kind := range []string{"gang-nvl72", "gang-hgx", "gang-fleet"} {
		spec := "gen:" + kind + ":seed=3:jobs=300"
		a, err := LoadTrace(spec)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := LoadTrace(spec)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("%s differs between two loads:\n%s", spec, diff)
		}
		groups := 0
		for _, j := range a.Jobs {
			switch {
			case j.Group():
				groups++
				if j.Pods < 2 || j.Pods > 16 || j.GPUs != 4 && j.GPUs != 8 {
					t.Fatalf("%s: group %+v: want 2..16 pods of 4 or 8 GPUs", spec, j)
				}
				if kind == "gang-nvl72" && j.GPUs != 4 {
					t.Fatalf("%s: group %+v asks 8-GPU pods of 4-GPU trays", spec, j)
				}
			case j.Pods != 1:
				t.Fatalf("%s: single-pod job %+v has Pods %d", spec, j, j.Pods)
			}
		}
		if groups < 100 || groups > 200 {
			t.Errorf("%s: %d groups of 300 jobs, want about half", spec, groups)
		}
		var buf strings.Builder
		if err := WriteTrace(&buf, nil, a.Jobs); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), GangTraceHeader+"\n") {
			t.Fatalf("trace with groups written without the pods column:\n%.200s", buf.String())
		}
		back, err := ParseTrace(strings.NewReader(buf.String()))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(a.Jobs, back); diff != "" {
			t.Errorf("%s round trip (-want +got):\n%s", spec, diff)
		}
	}
	if _, err := ParseTrace(strings.NewReader(GangTraceHeader + "\na,0,10,4,data,0\n")); err == nil || !strings.Contains(err.Error(), "pods") {
		t.Errorf("pods 0: error %v, want one naming pods", err)
	}
	if _, err := Run(Config{Nodes: mustCluster(t, "hgx-h100=2"), Jobs: []Job{{ID: "g", Duration: time.Minute, GPUs: 8, Pods: 2}}}); err == nil || !strings.Contains(err.Error(), "gang") {
		t.Errorf("Run with a group: error %v, want one pointing at the gang policies", err)
	}
}

func TestGroupShapeAndBandwidth(t *testing.T) {
	// Trays 0-3 (racks of two, leaf-0 and leaf-1, spine-0), HGX H100 4-5
	// (leaf-2) and a PCIe server 6 (leaf-3), both under spine-1.
	nodes := mustCluster(t, "gb200-nvl72-tray=4/rack=2/leaf=2,hgx-h100=2/leaf=2,pcie-8x=1/leaf=1;spine=2")
	fab := newFabric(nodes, configv1alpha1.DefaultFabricLevels())
	all4 := mask(0, 1, 2, 3)
	on := func(pl ...Placement) []Placement { return pl }
	tests := []struct {
		name string
		pods []Placement
		want groupShape
	}{
		{"two trays of one rack: the NVLink domain, the trays' own ring",
			on(Placement{0, all4}, Placement{1, all4}),
			groupShape{Level: "nvlink", NVLink: true, Leaf: true, PodsNVLink: true, GBps: 1800}},
		{"trays of two racks under one leaf: the leaf's bandwidth",
			on(Placement{1, all4}, Placement{2, all4}),
			groupShape{Level: "spine", NVLink: false, Leaf: false, PodsNVLink: true, GBps: 50}},
		{"two pods on one HGX H100: one node, NVLink, its ring",
			on(Placement{4, all4}, Placement{4, mask(4, 5, 6, 7)}),
			groupShape{Level: "node", NVLink: true, Leaf: true, PodsNVLink: true, GBps: 900}},
		{"two HGX H100 of one leaf",
			on(Placement{4, all4}, Placement{5, all4}),
			groupShape{Level: "leaf", Leaf: true, PodsNVLink: true, GBps: 100}},
		{"HGX H100 and a PCIe server: the PCIe ring, under one spine",
			on(Placement{5, all4}, Placement{6, all4}),
			groupShape{Level: "spine", PodsNVLink: false, GBps: 40}},
		{"a tray and an HGX H100 under two spines: no shared domain",
			on(Placement{0, all4}, Placement{4, all4}),
			groupShape{Level: "cluster", PodsNVLink: true, GBps: configv1alpha1.CrossZoneBandwidthGBps}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, fab.shape(tt.pods)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
	// One NVLink domain holds 2 pods of 4 GPUs (a rack of two trays, or an
	// H100), 1 of 8 (an H100), 4 of 2.
	if got := []int{fab.nvlinkPods(4), fab.nvlinkPods(8), fab.nvlinkPods(2)}; !cmp.Equal(got, []int{2, 1, 4}) {
		t.Errorf("pods one NVLink domain holds, 4/8/2 GPUs each: %v, want [2 1 4]", got)
	}
}

// gangCase is a hand-computed gang trace: an 8-GPU job holds one of two
// HGX H100 nodes for 1000 s; a group of two 8-GPU pods arrives at 10 s.
func gangCase(t *testing.T, maxWait time.Duration) []GangResult {
	t.Helper()
	jobs := []Job{
		{ID: "solo", Arrival: 0, Duration: 1000 * time.Second, GPUs: 8, Pods: 1, Parallelism: v1alpha1.ParallelismData},
		{ID: "pair", Arrival: 10 * time.Second, Duration: 100 * time.Second, GPUs: 8, Pods: 2, Parallelism: v1alpha1.ParallelismModel},
	}
	rs, err := RunGang(GangConfig{Nodes: mustCluster(t, "hgx-h100=2/leaf=2"), Jobs: jobs, MaxWait: maxWait})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != len(GangPolicyNames) {
		t.Fatalf("%d results, want one per gang policy", len(rs))
	}
	return rs
}

func TestPartialHoldIsMeasured(t *testing.T) {
	type outcome struct {
		GroupsPlaced, GroupsPartial int
		HeldGPUHours                float64
		GroupMeanWait               time.Duration
		GroupWaitP95, GroupWaitMax  time.Duration
		SingleMeanWait              time.Duration
		GBps                        float64
	}
	// The group fits only once the solo job ends at 1000 s. The per-pod
	// policy places one pod at 10 s on the free node and holds its 8 GPUs
	// for 990 s (2.2 GPU-hours); the all-or-nothing policies hold
	// nothing. Either way the group starts at 1000 s, over one leaf.
	got := map[string]outcome{}
	for _, r := range gangCase(t, time.Hour) {
		got[r.Policy] = outcome{r.GroupsPlaced, r.GroupsPartial, r.HeldGPUHours, r.GroupMeanWait, r.GroupWaitP95, r.GroupWaitMax, r.SingleMeanWait, r.GroupGBpsMean}
	}
	// The solo job starts as it arrives: the single-pod wait is 0.
	all := outcome{1, 0, 0, 990 * time.Second, 990 * time.Second, 990 * time.Second, 0, 100}
	want := map[string]outcome{GangGputopo: all, GangFirstFit: all, GangTAS: all, GangOptimum: all,
		GangPerPod: {1, 1, 8 * 990.0 / 3600, 990 * time.Second, 990 * time.Second, 990 * time.Second, 0, 100}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcomes (-want +got):\n%s", diff)
	}
	// With a 500 s timeout the group is given up at 510 s: the per-pod
	// policy held its pod 500 s, and the wait counts the whole timeout.
	for _, r := range gangCase(t, 500*time.Second) {
		held := 0.0
		if r.Policy == GangPerPod {
			held = 8 * 500.0 / 3600
		}
		if r.GroupsPlaced != 0 || r.Accepted != 1 || r.HeldGPUHours != held || r.GroupMeanWait != 500*time.Second || r.MeanWait != 250*time.Second ||
			r.GroupWaitP95 != 500*time.Second || r.GroupWaitMax != 500*time.Second || r.SingleMeanWait != 0 {
			t.Errorf("%s with a 500 s timeout: %+v; want the group given up, %.2f GPU-h held, group wait 500s (p95 and max too), job wait 250s, single-pod wait 0", r.Policy, r, held)
		}
	}
}

func TestGangPoliciesPlaceGroupsWhole(t *testing.T) {
	// Two NVL72 racks of four trays under one leaf; rack 0 has one tray
	// taken. A group of three 4-GPU pods fits both racks; the placers
	// that know the fabric take rack 0 (best fit), the count-only one the
	// first trays in order, and every policy places all three pods at
	// once, each on a whole tray.
	nodes := mustCluster(t, "gb200-nvl72-tray=8/rack=4/leaf=8")
	jobs := []Job{
		{ID: "one", Arrival: 0, Duration: time.Hour, GPUs: 4, Pods: 1, Parallelism: v1alpha1.ParallelismData},
		{ID: "trio", Arrival: time.Second, Duration: time.Hour, GPUs: 4, Pods: 3, Parallelism: v1alpha1.ParallelismModel},
	}
	rs, err := RunGang(GangConfig{Nodes: nodes, Jobs: jobs})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.GroupsPlaced != 1 || r.GroupsPartial != 0 || len(r.Placed) != 1 {
			t.Fatalf("%s: %+v, want the group placed whole", r.Policy, r)
		}
		p := r.Placed[0]
		racks := map[string]bool{}
		for _, pl := range p.Pods {
			racks[nodes[pl.Node].Labels[LabelClique]] = true
			if pl.GPUs.Count() != 4 {
				t.Errorf("%s: pod on %s", r.Policy, pl.GPUs)
			}
		}
		if r.Policy != GangFirstFit && (len(racks) != 1 || !p.Shape.NVLink || p.Shape.GBps != 1800) {
			t.Errorf("%s: group over racks %v (%+v), want one rack at 1800 GB/s", r.Policy, racks, p.Shape)
		}
	}
}

// A stream of small jobs keeps two HGX H100 nodes busy: 16 one-GPU jobs
// at 0 s ending one every 5 minutes, then a one-GPU job every 4 minutes
// lasting 30. A group of two 8-GPU pods arrives at 1 minute. Each GPU
// that frees goes to the stream, so the group never has both nodes free
// at once; once it has waited fabric.reserveAfter (10 minutes), the GPUs
// it needs are kept for it, the stream's pods wait, and it starts when
// the last pod on them ends (80 minutes, the last of the first 16).
func TestReservationStartsAGroupAStreamOfSmallJobsStarves(t *testing.T) {
	var jobs []Job
	for i := range 16 {
		jobs = append(jobs, Job{ID: fmt.Sprintf("first-%02d", i), Duration: time.Duration(i+1) * 5 * time.Minute, GPUs: 1, Pods: 1, Parallelism: v1alpha1.ParallelismData})
	}
	jobs = append(jobs, Job{ID: "pair", Arrival: time.Minute, Duration: 10 * time.Minute, GPUs: 8, Pods: 2, Parallelism: v1alpha1.ParallelismModel})
	for i := range 45 {
		jobs = append(jobs, Job{ID: fmt.Sprintf("stream-%02d", i), Arrival: 2*time.Minute + time.Duration(i)*4*time.Minute, Duration: 30 * time.Minute, GPUs: 1, Pods: 1, Parallelism: v1alpha1.ParallelismData})
	}
	run := func(reserveAfter time.Duration) GangResult {
		ext := configv1alpha1.DefaultExtenderConfiguration()
		ext.Fabric.ReserveAfter = metav1.Duration{Duration: reserveAfter}
		ext.Fabric.ReserveMaxPercent = ptr.To[int32](100)
		ext.Fabric.ReserveMaxDuration = metav1.Duration{Duration: 2 * time.Hour}
		rs, err := RunGang(GangConfig{Nodes: mustCluster(t, "hgx-h100=2/leaf=2"), Jobs: jobs, MaxWait: 2 * time.Hour, Extender: ext, Policies: []string{GangGputopo}})
		if err != nil {
			t.Fatal(err)
		}
		return rs[0]
	}
	if r := run(0); r.GroupsPlaced != 0 {
		t.Fatalf("without reservations the group was placed (%+v); the case no longer starves it", r.Placed)
	}
	r := run(10 * time.Minute)
	if r.GroupsPlaced != 1 || r.Placed[0].Start != 80*time.Minute {
		t.Fatalf("with reservations: %d groups placed %+v; want the group started at 80m, when its GPUs drained", r.GroupsPlaced, r.Placed)
	}
	if r.Accepted != len(jobs) {
		t.Errorf("with reservations %d of %d jobs placed; the stream's pods wait, they are not lost", r.Accepted, len(jobs))
	}
}
