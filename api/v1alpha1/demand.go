package v1alpha1

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	resourcehelper "k8s.io/component-helpers/resource"
)

// MaxContainerGPUs is the largest count of a GPU resource one container may
// ask for. No machine has more than a few dozen GPUs; the bound keeps every
// sum far from overflow.
const MaxContainerGPUs = 1 << 16

// PodGPUDemand is the number of devices of resource (e.g. nvidia.com/gpu)
// the pod holds on its node while it lives. It is the one rule the
// webhook, the extender, the node agent and the simulator share, and it
// follows kubelet's device manager:
//
//   - a container asks for its limit, else its request (for extended
//     resources requests default to limits and must equal them);
//   - app containers and restartable init containers (sidecars) run
//     together, so their counts are summed;
//   - one-shot init containers run one at a time before the app
//     containers, each beside the sidecars started before it, so the pod
//     needs the largest of those; kubelet hands an init container's devices
//     on to the containers after it, and keeps them with the pod until it
//     ends.
//
// The aggregation itself is k8s.io/component-helpers' (the rule
// kube-scheduler and kubelet use for every resource). A negative,
// fractional or absurdly large count is an error naming the container's
// field, all of them at once; the count is then 0.
func PodGPUDemand(spec *corev1.PodSpec, name corev1.ResourceName) (int64, error) {
	var errs field.ErrorList
	view := &corev1.Pod{Spec: corev1.PodSpec{
		Containers:     make([]corev1.Container, len(spec.Containers)),
		InitContainers: make([]corev1.Container, len(spec.InitContainers)),
	}}
	fill := func(dst []corev1.Container, src []corev1.Container, path *field.Path) {
		for i := range src {
			dst[i].Name, dst[i].RestartPolicy = src[i].Name, src[i].RestartPolicy
			n, err := containerDemand(&src[i].Resources, name, path.Index(i).Child("resources"))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if n > 0 {
				dst[i].Resources.Limits = corev1.ResourceList{name: *resource.NewQuantity(n, resource.DecimalSI)}
			}
		}
	}
	spec0 := field.NewPath("spec")
	fill(view.Spec.InitContainers, spec.InitContainers, spec0.Child("initContainers"))
	fill(view.Spec.Containers, spec.Containers, spec0.Child("containers"))
	if len(errs) > 0 {
		return 0, errs.ToAggregate()
	}
	q, ok := resourcehelper.PodLimits(view, resourcehelper.PodResourcesOptions{SkipPodLevelResources: true, ExcludeOverhead: true})[name]
	if !ok {
		return 0, nil
	}
	return q.Value(), nil
}

// containerDemand is one container's count: its limit, else its request.
func containerDemand(r *corev1.ResourceRequirements, name corev1.ResourceName, path *field.Path) (int64, *field.Error) {
	q, ok := r.Limits[name]
	p := path.Child("limits").Key(string(name))
	if !ok {
		if q, ok = r.Requests[name]; !ok {
			return 0, nil
		}
		p = path.Child("requests").Key(string(name))
	}
	switch {
	case q.Sign() < 0:
		return 0, field.Invalid(p, q.String(), "must not be negative")
	case q.Cmp(*resource.NewQuantity(MaxContainerGPUs, resource.DecimalSI)) > 0:
		return 0, field.Invalid(p, q.String(), fmt.Sprintf("must be at most %d", MaxContainerGPUs))
	}
	n, ok := q.AsInt64()
	if !ok || q.MilliValue() != n*1000 {
		return 0, field.Invalid(p, q.String(), "must be a whole number of devices")
	}
	return n, nil
}
