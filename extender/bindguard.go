package extender

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// errRefused labels binds refused because kube-scheduler would never have
// sent them (errors metric).
const errRefused = "refused"

// bindPod reads the pod bind decides on: the informer cache when it holds
// this very pod, else the API server.
func (x *Extender) bindPod(ctx context.Context, key types.NamespacedName, uid types.UID) (*corev1.Pod, error) {
	if x.podStore != nil {
		if o, ok, err := x.podStore.GetByKey(key.String()); err == nil && ok {
			if p, ok := o.(*corev1.Pod); ok && p.UID == uid {
				return p, nil
			}
		}
		return x.getPod(ctx, key)
	}
	if x.cache != nil {
		p := &corev1.Pod{}
		if err := x.cache.Get(ctx, key, p); err == nil && p.UID == uid {
			return p, nil
		}
	}
	return x.getPod(ctx, key)
}

// bindNode reads the node from the informer cache, which watches every
// Node (the extender may list and watch nodes, not get them): a node it
// has not seen does not exist, or was created a moment ago and is bound
// to on kube-scheduler's retry. Without informers (in-process use) it asks
// the API server.
func (x *Extender) bindNode(ctx context.Context, name string) (*corev1.Node, error) {
	if x.nodeStore != nil {
		o, ok, err := x.nodeStore.GetByKey(name)
		if err != nil {
			return nil, err
		}
		n, isNode := o.(*corev1.Node)
		if !ok || !isNode {
			return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
		}
		return n, nil
	}
	if x.cache != nil {
		n := &corev1.Node{}
		if err := x.cache.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
			return nil, err
		}
		return n, nil
	}
	gctx, cancel := context.WithTimeout(ctx, x.cfg.BindTimeout.Duration)
	defer cancel()
	return x.client.CoreV1().Nodes().Get(gctx, name, metav1.GetOptions{})
}

// admitBind refuses, even from an authenticated caller, a bind that
// kube-scheduler's gputopo profile would never send: a pod addressed to
// another scheduler, a pod that requests no managed GPU resource, and a
// node that the pod's nodeSelector, required node affinity or untolerated
// NoSchedule/NoExecute taints exclude. The reason names what excluded it.
func (x *Extender) admitBind(ctx context.Context, p *corev1.Pod, gpus int, node string) error {
	key := klog.KObj(p)
	if !slices.Contains(x.opts.SchedulerNames, p.Spec.SchedulerName) {
		return bindErr(errRefused, "refusing to bind pod %s: its schedulerName %q is not a gputopo scheduler profile (%s); only those profiles call this extender",
			key, p.Spec.SchedulerName, strings.Join(x.opts.SchedulerNames, ", "))
	}
	if gpus <= 0 {
		return bindErr(errRefused, "refusing to bind pod %s: it requests no %s; pods without GPUs are bound by kube-scheduler itself", key, x.cfg.GPUResource())
	}
	n, err := x.bindNode(ctx, node)
	switch {
	case apierrors.IsNotFound(err):
		return bindErr(errRefused, "refusing to bind pod %s: node %s does not exist", key, node)
	case err != nil:
		return bindErr(errAPIUnknown, "bind pod %s: read node %s: %w", key, node, err)
	}
	ok, err := nodeaffinity.GetRequiredNodeAffinity(p).Match(n)
	if err != nil {
		return bindErr(errRefused, "refusing to bind pod %s: its node affinity cannot be evaluated: %w", key, err)
	}
	if !ok {
		return bindErr(errRefused, "refusing to bind pod %s to node %s: the pod's nodeSelector or required node affinity excludes the node", key, node)
	}
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.FromContext(ctx), n.Spec.Taints, p.Spec.Tolerations, func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}, false)
	if untolerated {
		return bindErr(errRefused, "refusing to bind pod %s to node %s: the pod does not tolerate the node's taint %s", key, node, fmt.Sprintf("%s=%s:%s", taint.Key, taint.Value, taint.Effect))
	}
	return nil
}
