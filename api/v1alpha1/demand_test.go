package v1alpha1

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func gpuContainer(name, count string, sidecar bool, requestsOnly bool) corev1.Container {
	c := corev1.Container{Name: name}
	if count != "" {
		l := corev1.ResourceList{ResourceGPU: resource.MustParse(count)}
		if requestsOnly {
			c.Resources.Requests = l
		} else {
			c.Resources.Limits, c.Resources.Requests = l, l
		}
	}
	if sidecar {
		always := corev1.ContainerRestartPolicyAlways
		c.RestartPolicy = &always
	}
	return c
}

func TestPodGPUDemand(t *testing.T) {
	app := func(n string) corev1.Container { return gpuContainer("app-"+n, n, false, false) }
	initc := func(n string) corev1.Container { return gpuContainer("init-"+n, n, false, false) }
	side := func(n string) corev1.Container { return gpuContainer("side-"+n, n, true, false) }
	tests := map[string]struct {
		init, apps []corev1.Container
		want       int64
		wantErr    string
	}{
		"no GPUs":                       {apps: []corev1.Container{{Name: "a"}}, want: 0},
		"one app container":             {apps: []corev1.Container{app("4")}, want: 4},
		"two app containers are summed": {apps: []corev1.Container{app("2"), app("2")}, want: 4},
		"init-only GPUs are held":       {init: []corev1.Container{initc("2")}, apps: []corev1.Container{{Name: "a"}}, want: 2},
		"init 4 + app 2 takes the max":  {init: []corev1.Container{initc("4")}, apps: []corev1.Container{app("2")}, want: 4},
		"init 1 + app 3 takes the max":  {init: []corev1.Container{initc("1")}, apps: []corev1.Container{app("3")}, want: 3},
		"sidecar 1 + app 2 are summed":  {init: []corev1.Container{side("1")}, apps: []corev1.Container{app("2")}, want: 3},
		"init after a sidecar runs beside it": {
			init: []corev1.Container{side("2"), initc("3")}, apps: []corev1.Container{app("1")}, want: 5},
		"init before a sidecar does not": {
			init: []corev1.Container{initc("3"), side("2")}, apps: []corev1.Container{app("1")}, want: 3},
		"requests count when limits are absent": {apps: []corev1.Container{gpuContainer("r", "2", false, true)}, want: 2},
		"negative count refused":                {apps: []corev1.Container{app("-1")}, wantErr: "spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: \"-1\": must not be negative"},
		"fractional count refused":              {init: []corev1.Container{initc("500m")}, wantErr: "spec.initContainers[0].resources.limits[nvidia.com/gpu]: Invalid value: \"500m\": must be a whole number"},
		"huge count refused":                    {apps: []corev1.Container{app("1e30")}, wantErr: "must be at most 65536"},
		"every bad field reported at once": {
			init: []corev1.Container{initc("-2")}, apps: []corev1.Container{app("2"), app("1e30")},
			wantErr: "spec.initContainers[0]"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := PodGPUDemand(&corev1.PodSpec{InitContainers: tc.init, Containers: tc.apps}, ResourceGPU)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PodGPUDemand error = %v; want it to contain %q", err, tc.wantErr)
				}
				if name == "every bad field reported at once" && !strings.Contains(err.Error(), "spec.containers[1]") {
					t.Fatalf("PodGPUDemand error = %v; want both bad fields", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("PodGPUDemand: %v", err)
			}
			if got != tc.want {
				t.Fatalf("PodGPUDemand = %d; want %d", got, tc.want)
			}
		})
	}
}

func TestPodGPUDemandOtherResource(t *testing.T) {
	c := corev1.Container{Name: "a", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
		ResourceGPU: resource.MustParse("2"), "example.com/gpu": resource.MustParse("3")}}}
	got, err := PodGPUDemand(&corev1.PodSpec{Containers: []corev1.Container{c}}, "example.com/gpu")
	if err != nil || got != 3 {
		t.Fatalf("PodGPUDemand(example.com/gpu) = %d, %v; want 3", got, err)
	}
}
