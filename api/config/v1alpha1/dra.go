package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
)

// ServedGPUs is how many GPUs requests ask of the DRA driver's served
// DeviceClasses (classes, DRA.DeviceClasses): the sum of their exact counts
// (count 0 is 1), admin access counting none. A request gputopo cannot
// choose for is an error naming the request and the fix: all devices of
// a served class, or a served class in a firstAvailable list.
func ServedGPUs(reqs []resourcev1.DeviceRequest, classes []string) (int, error) {
	total := 0
	for _, r := range reqs {
		switch {
		case r.Exactly != nil && slices.Contains(classes, r.Exactly.DeviceClassName):
			e := r.Exactly
			if e.AdminAccess != nil && *e.AdminAccess {
				continue // admin access takes no GPU from anyone
			}
			if e.AllocationMode == resourcev1.DeviceAllocationModeAll {
				return 0, fmt.Errorf("request %q asks all devices of class %s: gputopo chooses GPUs for an exact count; set allocationMode: ExactCount and count", r.Name, e.DeviceClassName)
			}
			total += int(max(e.Count, 1))
		case r.Exactly == nil:
			for _, sr := range r.FirstAvailable {
				if slices.Contains(classes, sr.DeviceClassName) {
					return 0, fmt.Errorf("request %q lists class %s among firstAvailable: gputopo chooses GPUs for one exact request; ask them with exactly", r.Name, sr.DeviceClassName)
				}
			}
		}
	}
	return total, nil
}

// UUIDAttributes are the names a device of d's driver may carry its UUID
// under: UUIDAttribute as written, and as the driver's domain qualifies
// it (uuid and gpu.nvidia.com/uuid name the same attribute of driver
// gpu.nvidia.com).
func (d DRA) UUIDAttributes() []string {
	out := []string{d.UUIDAttribute}
	if domain, name, ok := strings.Cut(d.UUIDAttribute, "/"); ok && domain == d.Driver {
		out = append(out, name)
	} else if !ok {
		out = append(out, d.Driver+"/"+d.UUIDAttribute)
	}
	return out
}

// DeviceUUID is the UUID device dev of d's driver carries in its UUID
// attribute ("" when none).
func (d DRA) DeviceUUID(dev *resourcev1.Device) string {
	for _, a := range d.UUIDAttributes() {
		if v, ok := dev.Attributes[resourcev1.QualifiedName(a)]; ok && v.StringValue != nil {
			return *v.StringValue
		}
	}
	return ""
}
