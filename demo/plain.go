package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	topomachine "github.com/gputopo/gputopo/topology/machine"
)

// AnnotationDevicePluginGPUs records, on a pod of the comparison cluster,
// the GPUs NVIDIA's device plugin chose for it (kubelet keeps that in its
// device-manager checkpoint; the demo runs no kubelet, so it writes them
// where the report and its test read them).
const AnnotationDevicePluginGPUs = "demo.gputopo.io/device-plugin-gpus"

// plainGPUs is kubelet with NVIDIA's device plugin under plain
// kube-scheduler: a bound pod's GPUs are the plugin's preferred
// allocation among the node's free ones, in bind order.
type plainGPUs struct{ dp *stockDevicePlugin }

func (plainGPUs) known(p *corev1.Pod) bool { return p.Spec.NodeName != "" }

func (s plainGPUs) gpus(ctx context.Context, c client.Client, p *corev1.Pod) ([]string, error) {
	if v := p.Annotations[AnnotationDevicePluginGPUs]; v != "" {
		return v1alpha1.ParseGPUList(AnnotationDevicePluginGPUs, v)
	}
	// What kubelet hands the device plugin: the pod's demand, init and
	// sidecar containers counted as Kubernetes counts them.
	count, err := v1alpha1.PodGPUDemand(&p.Spec, corev1.ResourceName(v1alpha1.ResourceGPU))
	if err != nil {
		return nil, err
	}
	uuids, err := s.dp.allocate(p.Spec.NodeName, int(count))
	if err != nil {
		return nil, err
	}
	patch := client.MergeFrom(p.DeepCopy())
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[AnnotationDevicePluginGPUs] = strings.Join(uuids, ",")
	if err := c.Patch(ctx, p, patch); err != nil {
		return nil, fmt.Errorf("record the device plugin's GPUs: %w", err)
	}
	return uuids, nil
}

func (s plainGPUs) gone(node string, uuids []string) { s.dp.release(node, uuids) }

// runPlain places the same workloads on the same nodes through plain
// kube-scheduler (its default profile, no gputopo anywhere) in a control
// plane of its own, and returns its admin kubeconfig and what was placed.
func runPlain(ctx context.Context, o Options, nodes []NodeView, say func(string, ...any), stops *[]func()) (string, []Placed, error) {
	say("starting a second etcd and kube-apiserver, plain kube-scheduler (default profile) and kube-controller-manager, with the same %d nodes", len(o.Cluster))
	cp, err := localcluster.StartControlPlane(localcluster.Options{})
	if err != nil {
		return "", nil, err
	}
	*stops = append(*stops, func() { _ = cp.Stop() })
	c, err := client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		return "", nil, fmt.Errorf("client: %w", err)
	}
	dir := filepath.Join(o.OutDir, "plain")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("output dir %s: %w", dir, err)
	}
	schedKubeconfig, err := cp.Kubeconfig(localcluster.SchedulerUser)
	if err != nil {
		return "", nil, err
	}
	sched, err := localcluster.StartScheduler(nil, schedKubeconfig, dir)
	if err != nil {
		return "", nil, err
	}
	*stops = append(*stops, sched.Stop)
	kcmKubeconfig, err := cp.Kubeconfig("gputopo-demo-controller-manager", "system:masters")
	if err != nil {
		return "", nil, err
	}
	kcm, err := localcluster.StartControllerManager(kcmKubeconfig, dir, "job-controller")
	if err != nil {
		return "", nil, err
	}
	*stops = append(*stops, kcm.Stop)
	for _, s := range o.Cluster {
		f, err := topomachine.Load(s.Fixture)
		if err != nil {
			return "", nil, fmt.Errorf("node %s: %w", s.Name, err)
		}
		if _, err := localcluster.CreateGPUNode(ctx, c, s.Name, f.GPUs, nodeLabels(f.Name)); err != nil {
			return "", nil, err
		}
	}
	dp, err := newStockDevicePlugin(o.Cluster)
	if err != nil {
		return "", nil, err
	}
	_, placed, err := place(ctx, c, o.Workloads, nodes, plainGPUs{dp}, false, say)
	if err != nil {
		return "", nil, fmt.Errorf("plain kube-scheduler: %w", err)
	}
	kubeconfig, err := cp.Kubeconfig("gputopo-demo-admin", "system:masters")
	if err != nil {
		return "", nil, err
	}
	return kubeconfig, placed, nil
}
