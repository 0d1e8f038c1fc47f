package cluster

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/placement"
)

// Protected classifies preemption victims by their PodDisruptionBudgets
// (placement.Protected), from the informer cache: the extender's preempt
// verb replaces kube-scheduler's victims with its own, so it must count
// their budgets as kube-scheduler would. nil before the cache is started
// and when the runtime reads a host's informers (the plugin build, whose
// victims kube-scheduler's own preemption chooses and counts).
func (r *Runtime) Protected() placement.Protected {
	c := r.api.cache
	if c == nil || r.opts.HostInformers != nil {
		return nil
	}
	return func(pods []types.NamespacedName) []bool { return protected(context.Background(), c, pods) }
}

// protected is kube-scheduler's reading of PodDisruptionBudgets for pods
// a preemption would evict on one node, most important first
// (defaultpreemption's filterPodsWithPDBViolation): each budget that
// selects a pod (a nil or empty selector selects none) and has not
// already seen it disrupted is counted down from its status's
// disruptionsAllowed; a pod is protected once a budget of its goes below
// zero. A pod the cache does not have, or one without labels, matches no
// budget.
func protected(ctx context.Context, c client.Reader, pods []types.NamespacedName) []bool {
	out := make([]bool, len(pods))
	budgets := map[string][]policyv1.PodDisruptionBudget{}
	allowed := map[types.NamespacedName]int32{}
	for i, key := range pods {
		p := &corev1.Pod{}
		if err := c.Get(ctx, key, p); err != nil || len(p.Labels) == 0 {
			continue
		}
		pdbs, listed := budgets[key.Namespace]
		if !listed {
			var l policyv1.PodDisruptionBudgetList
			if err := c.List(ctx, &l, client.InNamespace(key.Namespace)); err != nil {
				klog.FromContext(ctx).V(2).Info("PodDisruptionBudgets not read; victims counted as unprotected", "namespace", key.Namespace, "err", err)
			}
			pdbs = l.Items
			budgets[key.Namespace] = pdbs
		}
		for _, pdb := range pdbs {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil || sel.Empty() || !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
			if _, disrupted := pdb.Status.DisruptedPods[p.Name]; disrupted {
				continue
			}
			k := types.NamespacedName{Namespace: pdb.Namespace, Name: pdb.Name}
			left, seen := allowed[k]
			if !seen {
				left = pdb.Status.DisruptionsAllowed
			}
			left--
			allowed[k] = left
			if left < 0 {
				out[i] = true
			}
		}
	}
	return out
}
