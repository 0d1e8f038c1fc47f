package nodeagent

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// DeviceListStrategy is how an Allocate answer tells the container runtime
// (the NVIDIA container toolkit, or the runtime's own CDI support) which
// GPUs a container gets. The names are those of NVIDIA's k8s-device-plugin,
// so a cluster's toolkit configuration carries over.
type DeviceListStrategy string

const (
	// DeviceListEnvvar sets NVIDIA_VISIBLE_DEVICES=<UUIDs>. It is the
	// default, and the weakest: the toolkit reads the container's final
	// environment, where a value the pod sets through env or envFrom comes
	// after the device plugin's and wins.
	DeviceListEnvvar DeviceListStrategy = "envvar"
	// DeviceListVolumeMounts mounts /dev/null at
	// /var/run/nvidia-container-devices/<UUID> for each GPU and sets
	// NVIDIA_VISIBLE_DEVICES to that directory. The toolkit reads the
	// mounts with accept-nvidia-visible-devices-as-volume-mounts=true, and
	// they win over the environment.
	DeviceListVolumeMounts DeviceListStrategy = "volume-mounts"
	// DeviceListCDICRI names each GPU as a CDI device (<cdi-kind>=<UUID>) in
	// the answer's CDIDevices, which kubelet passes in the CRI
	// ContainerConfig; the runtime (containerd, CRI-O) injects them from the
	// node's CDI spec. No environment variable is set.
	DeviceListCDICRI DeviceListStrategy = "cdi-cri"
)

// DeviceListStrategies are the valid strategies, the default first.
var DeviceListStrategies = []DeviceListStrategy{DeviceListEnvvar, DeviceListVolumeMounts, DeviceListCDICRI}

// DefaultCDIKind is the CDI kind (vendor/class) of the GPUs in the spec
// that NVIDIA's tooling (nvidia-ctk cdi generate, the GPU operator)
// writes; its device names include the GPU UUIDs.
const DefaultCDIKind = "nvidia.com/gpu"

// DeviceListMountRoot is the container directory under which the
// volume-mounts strategy names each GPU; the NVIDIA container toolkit reads
// the mounts below it whose host path is /dev/null.
const DeviceListMountRoot = "/var/run/nvidia-container-devices"

// deviceListMountSource is the host path of every volume-mounts mount: the
// toolkit only counts mounts of /dev/null.
const deviceListMountSource = "/dev/null"

// The CDI naming rules (tags.cncf.io/container-device-interface parser):
// vendor a domain-like name, class and device plain names.
var (
	cdiVendorRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	cdiClassRE  = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$`)
)

// ValidateDeviceList checks strategy names and the CDI kind, reporting
// every problem at once under the given flag paths.
func ValidateDeviceList(strategies []string, cdiKind string, strategyPath, kindPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	valid := make([]string, len(DeviceListStrategies))
	for i, s := range DeviceListStrategies {
		valid[i] = string(s)
	}
	for i, s := range strategies {
		if !slices.Contains(valid, s) {
			errs = append(errs, field.NotSupported(strategyPath.Index(i), s, valid))
		}
	}
	if vendor, class, ok := strings.Cut(cdiKind, "/"); !ok || !cdiVendorRE.MatchString(vendor) || !cdiClassRE.MatchString(class) {
		errs = append(errs, field.Invalid(kindPath, cdiKind,
			"must be a CDI kind <vendor>/<class> (letters, digits, '-', '_', and '.' in the vendor), e.g. "+DefaultCDIKind))
	}
	return errs
}

// deviceList builds the part of an Allocate answer that names a
// container's GPUs, for a validated set of strategies. Like NVIDIA's
// plugin: volume-mounts' NVIDIA_VISIBLE_DEVICES (the mount root) replaces
// envvar's list when both are on, and CDI strategies alone set no
// environment.
type deviceList struct {
	envvar, volumeMounts, cdiCRI bool
	cdiKind                      string
}

// deviceList is the Allocate answer builder for defaulted options, or an
// error naming what is wrong with them.
func (o *DevicePluginOptions) deviceList() (deviceList, error) {
	names := make([]string, len(o.DeviceListStrategies))
	for i, s := range o.DeviceListStrategies {
		names[i] = string(s)
	}
	if errs := ValidateDeviceList(names, o.CDIKind, field.NewPath("DeviceListStrategies"), field.NewPath("CDIKind")); len(errs) > 0 {
		return deviceList{}, fmt.Errorf("device plugin options: %w", errs.ToAggregate())
	}
	return newDeviceList(o.DeviceListStrategies, o.CDIKind), nil
}

func newDeviceList(strategies []DeviceListStrategy, cdiKind string) deviceList {
	return deviceList{
		envvar:       slices.Contains(strategies, DeviceListEnvvar),
		volumeMounts: slices.Contains(strategies, DeviceListVolumeMounts),
		cdiCRI:       slices.Contains(strategies, DeviceListCDICRI),
		cdiKind:      cdiKind,
	}
}

// response is the answer for one container holding exactly ids.
func (d deviceList) response(ids []string) *pluginapi.ContainerAllocateResponse {
	r := &pluginapi.ContainerAllocateResponse{}
	if d.envvar {
		r.Envs = map[string]string{v1alpha1.EnvVisibleDevices: strings.Join(ids, ",")}
	}
	if d.volumeMounts {
		r.Envs = map[string]string{v1alpha1.EnvVisibleDevices: DeviceListMountRoot}
		for _, id := range ids {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{
				ContainerPath: path.Join(DeviceListMountRoot, id), HostPath: deviceListMountSource,
			})
		}
	}
	if d.cdiCRI {
		for _, id := range ids {
			r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: fmt.Sprintf("%s=%s", d.cdiKind, id)})
		}
	}
	return r
}
