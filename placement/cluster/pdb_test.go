package cluster

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// protected reads budgets as kube-scheduler's preemption does: each budget
// selecting a pod is counted down from its disruptionsAllowed in the
// pods' order; a pod it has already seen disrupted does not count; a
// budget with an empty selector selects nothing; a budget of another
// namespace does not apply; a pod without labels, or unknown, matches
// nothing.
func TestProtectedCountsBudgetsDownAsKubeSchedulerDoes(t *testing.T) {
	pod := func(ns, name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	app := map[string]string{"app": "a"}
	one := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "one"},
		Spec:   policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{MatchLabels: app}},
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1, DisruptedPods: map[string]metav1.Time{"going": {}}}}
	empty := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "empty"},
		Spec: policyv1.PodDisruptionBudgetSpec{Selector: &metav1.LabelSelector{}}}
	c := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(
		pod("ml", "first", app), pod("ml", "going", app), pod("ml", "second", app), pod("ml", "bare", nil),
		pod("other", "third", app), one, empty,
	).Build()
	keys := []types.NamespacedName{{Namespace: "ml", Name: "first"}, {Namespace: "ml", Name: "going"}, {Namespace: "ml", Name: "second"},
		{Namespace: "ml", Name: "bare"}, {Namespace: "other", Name: "third"}, {Namespace: "ml", Name: "unknown"}}
	got := protected(context.Background(), c, keys)
	// first uses the one disruption allowed; going is already counted;
	// second breaches the budget.
	if want := []bool{false, false, true, false, false, false}; !slices.Equal(got, want) {
		t.Errorf("protected %v, want %v", got, want)
	}
}
