package placement

import (
	"context"
	"errors"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// API is what bind reads and writes: the cluster (package
// placement/cluster), or a front end's own (the simulator binds in
// memory).
type API interface {
	// Pod is the pod bind decides on: a cache may answer when it holds
	// this very UID.
	Pod(ctx context.Context, key types.NamespacedName, uid types.UID) (*corev1.Pod, error)
	// FreshPod reads the pod from the source of truth, to settle a bind
	// whose outcome is unknown.
	FreshPod(ctx context.Context, key types.NamespacedName) (*corev1.Pod, error)
	// Node is the node the pod's constraints are checked against; a
	// NotFound error when there is none.
	Node(ctx context.Context, name string) (*corev1.Node, error)
	// Bind writes the Binding.
	Bind(ctx context.Context, b *corev1.Binding) error
}

// admitBind refuses, even from an authenticated caller, a bind that
// kube-scheduler's gputopo profile would never send: a pod addressed to
// another scheduler, a pod that requests no managed GPU resource, and a
// node that the pod's nodeSelector, required node affinity or untolerated
// NoSchedule/NoExecute taints exclude. The reason names what excluded it;
// a refusal releases what the pod held.
func (x *Core) admitBind(ctx context.Context, p *corev1.Pod, gpus int, node string) BindResult {
	key := klog.KObj(p)
	if !slices.Contains(x.opts.SchedulerNames, p.Spec.SchedulerName) {
		return failed(Released, ErrRefused, "refusing to bind pod %s: its schedulerName %q is not a gputopo scheduler profile (%s); only those profiles call this extender",
			key, p.Spec.SchedulerName, strings.Join(x.opts.SchedulerNames, ", "))
	}
	if gpus <= 0 {
		return failed(Released, ErrRefused, "refusing to bind pod %s: it requests no %s and no GPUs through ResourceClaims of class %s; pods without GPUs are bound by kube-scheduler itself (schedulerName %s)", key, x.cfg.GPUResource(), strings.Join(x.cfg.DRA.DeviceClasses, " or "), corev1.DefaultSchedulerName)
	}
	n, err := x.api.Node(ctx, node)
	switch {
	case apierrors.IsNotFound(err):
		return failed(Released, ErrRefused, "refusing to bind pod %s: node %s does not exist", key, node)
	case err != nil:
		return failed(Released, ErrAPIUnknown, "bind pod %s: read node %s: %w", key, node, err)
	}
	why, err := NodeRulesOf(p).Excludes(ctx, n)
	if err != nil {
		return failed(Released, ErrRefused, "refusing to bind pod %s: its node affinity cannot be evaluated: %w", key, err)
	}
	if why != "" {
		return failed(Released, ErrRefused, "refusing to bind pod %s to node %s: %s", key, node, why)
	}
	return BindResult{}
}

// errNoAPI is what a core without a cluster answers a bind.
var errNoAPI = errors.New("no cluster to bind in: this core only answers filter, score and explain")

// noAPI is the API of a core without a cluster.
type noAPI struct{}

func (noAPI) Pod(context.Context, types.NamespacedName, types.UID) (*corev1.Pod, error) {
	return nil, errNoAPI
}
func (noAPI) FreshPod(context.Context, types.NamespacedName) (*corev1.Pod, error) {
	return nil, errNoAPI
}
func (noAPI) Node(context.Context, string) (*corev1.Node, error) { return nil, errNoAPI }
func (noAPI) Bind(context.Context, *corev1.Binding) error        { return errNoAPI }
