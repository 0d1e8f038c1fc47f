package extender

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A client that reaches the bind verb (even with a valid certificate) must
// not be able to place a pod where kube-scheduler's gputopo profile never
// would.
func TestBindRefusesWhatKubeSchedulerWouldNeverSend(t *testing.T) {
	node := func(name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	noSchedule := corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	preferNo := corev1.Taint{Key: "soft", Value: "x", Effect: corev1.TaintEffectPreferNoSchedule}
	tests := map[string]struct {
		pod     *corev1.Pod
		node    *corev1.Node
		wantErr string // "" binds
	}{
		"gputopo pod on a plain node binds": {
			pod: makePod("ok").gpus(2).obj(), node: node("a", nil)},
		"pod addressed to another scheduler is refused": {
			pod: func() *corev1.Pod {
				p := makePod("other").gpus(2).obj()
				p.Spec.SchedulerName = "default-scheduler"
				return p
			}(),
			node:    node("a", nil),
			wantErr: `schedulerName "default-scheduler" is not a gputopo scheduler profile`},
		"pod without GPUs is refused": {
			pod: makePod("cpu").obj(), node: node("a", nil), wantErr: "requests no nvidia.com/gpu"},
		"node excluded by nodeSelector is refused": {
			pod: func() *corev1.Pod {
				p := makePod("sel").gpus(1).obj()
				p.Spec.NodeSelector = map[string]string{"pool": "train"}
				return p
			}(),
			node:    node("a", map[string]string{"pool": "infer"}),
			wantErr: "nodeSelector or required node affinity excludes the node"},
		"node matching nodeSelector binds": {
			pod: func() *corev1.Pod {
				p := makePod("sel2").gpus(1).obj()
				p.Spec.NodeSelector = map[string]string{"pool": "train"}
				return p
			}(),
			node: node("a", map[string]string{"pool": "train"})},
		"node excluded by required affinity is refused": {
			pod: func() *corev1.Pod {
				p := makePod("aff").gpus(1).obj()
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpIn, Values: []string{"h100"}}}}}}}}
				return p
			}(),
			node:    node("a", map[string]string{"gpu": "v100"}),
			wantErr: "excludes the node"},
		"untolerated NoSchedule taint is refused": {
			pod: makePod("taint").gpus(1).obj(), node: node("a", nil, noSchedule),
			wantErr: "does not tolerate the node's taint dedicated=infra:NoSchedule"},
		"tolerated NoSchedule taint binds": {
			pod: func() *corev1.Pod {
				p := makePod("tol").gpus(1).obj()
				p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoSchedule}}
				return p
			}(),
			node: node("a", nil, noSchedule)},
		"PreferNoSchedule taint does not refuse": {
			pod: makePod("soft").gpus(1).obj(), node: node("a", nil, preferNo)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			x, cs := newTestExtender(t, nil, tc.pod, tc.node)
			x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "a"))
			x.core.Feed().UpsertPod(tc.pod)
			res := x.Bind(context.Background(), bindArgs(tc.pod, "a"))
			got := getPod(t, cs, tc.pod.Name)
			if tc.wantErr == "" {
				if res.Error != "" || got.Spec.NodeName != "a" {
					t.Fatalf("bind: error %q, nodeName %q; want bound to a", res.Error, got.Spec.NodeName)
				}
				return
			}
			if !strings.Contains(res.Error, tc.wantErr) {
				t.Fatalf("bind error = %q; want it to contain %q", res.Error, tc.wantErr)
			}
			if got.Spec.NodeName != "" {
				t.Fatalf("refused pod was bound to %q", got.Spec.NodeName)
			}
			if c := x.core.Report().Counts(); c.Reserved != 0 || c.Held != 0 {
				t.Fatalf("refused bind left GPUs in the ledger: %s", c)
			}
		})
	}
}
