package placement

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// NodeRules are a pod's own rules for its node, as kube-scheduler's
// NodeAffinity and TaintToleration filters check them: its nodeSelector
// and required node affinity, and the NoSchedule and NoExecute taints it
// does not tolerate.
type NodeRules struct {
	pod *corev1.Pod
	aff nodeaffinity.RequiredNodeAffinity
}

// NodeRulesOf reads p's node rules once, for checking many nodes.
func NodeRulesOf(p *corev1.Pod) NodeRules {
	return NodeRules{pod: p, aff: nodeaffinity.GetRequiredNodeAffinity(p)}
}

// Excludes says why the rules exclude node n, "" when they do not; an
// error when the node affinity cannot be evaluated.
func (r NodeRules) Excludes(ctx context.Context, n *corev1.Node) (string, error) {
	ok, err := r.aff.Match(n)
	if err != nil {
		return "", err
	}
	if !ok {
		return "the pod's nodeSelector or required node affinity excludes the node", nil
	}
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.FromContext(ctx), n.Spec.Taints, r.pod.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false)
	if untolerated {
		return fmt.Sprintf("the pod does not tolerate the node's taint %s=%s:%s", taint.Key, taint.Value, taint.Effect), nil
	}
	return "", nil
}
