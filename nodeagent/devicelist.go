package nodeagent

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// DeviceListMountRoot is the container directory under which the
// volume-mounts strategy names each GPU; the NVIDIA container toolkit reads
// the mounts below it whose host path is /dev/null.
const DeviceListMountRoot = "/var/run/nvidia-container-devices"

// deviceListMountSource is the host path of every volume-mounts mount: the
// toolkit only counts mounts of /dev/null.
const deviceListMountSource = "/dev/null"

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
	if errs := configv1alpha1.ValidateDeviceList(names, o.CDIKind, field.NewPath("DeviceListStrategies"), field.NewPath("CDIKind")); len(errs) > 0 {
		return deviceList{}, fmt.Errorf("device plugin options: %w", errs.ToAggregate())
	}
	return newDeviceList(o.DeviceListStrategies, o.CDIKind), nil
}

func newDeviceList(strategies []configv1alpha1.DeviceListStrategy, cdiKind string) deviceList {
	return deviceList{
		envvar:       slices.Contains(strategies, configv1alpha1.DeviceListEnvvar),
		volumeMounts: slices.Contains(strategies, configv1alpha1.DeviceListVolumeMounts),
		cdiCRI:       slices.Contains(strategies, configv1alpha1.DeviceListCDICRI),
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
