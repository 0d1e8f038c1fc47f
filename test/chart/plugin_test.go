//go:build integration

package chart

import (
	"encoding/json"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/schedplugin"
	"github.com/gputopo/gputopo/test/harness"
)

var pluginRelease = release{name: "gputopo", namespace: "gputopo-system", values: `
scheduler:
  mode: plugin
`}

// TestPluginModeRendersNoExtender: with scheduler.mode plugin the chart
// installs no extender Deployment, Service or certificates, and the
// scheduler runs gputopo-scheduler from the gputopo image with the
// extender's ExtenderConfiguration mounted where its plugin args say.
func TestPluginModeRendersNoExtender(t *testing.T) {
	objs := pluginRelease.render(t)
	fn := pluginRelease.fullname()
	for _, o := range objs {
		switch {
		case o.GetKind() == "Deployment" && o.GetName() == fn+"-extender",
			o.GetKind() == "Service" && strings.HasPrefix(o.GetName(), fn+"-extender"),
			o.GetKind() == "Certificate" && (o.GetName() == fn+"-extender" || o.GetName() == fn+"-scheduler-client"),
			o.GetKind() == "PodDisruptionBudget" && o.GetName() == fn+"-extender":
			t.Errorf("plugin mode renders %s %s", o.GetKind(), o.GetName())
		}
	}
	dep, args := pluginScheduler(t, objs, fn)
	c := dep.Spec.Template.Spec.Containers[0]
	if len(c.Command) == 0 || c.Command[0] != "/usr/local/bin/gputopo-scheduler" || !strings.HasPrefix(c.Image, "ghcr.io/gputopo/gputopo:") {
		t.Errorf("scheduler container runs %q from %q; want /usr/local/bin/gputopo-scheduler from the gputopo image", c.Command, c.Image)
	}
	cm, ok := configMapMountedAt(dep.Spec.Template.Spec, c, path.Dir(args.ConfigFile))
	if !ok || cm != fn+"-extender" {
		t.Errorf("plugin args configFile %s is not in the extender's ConfigMap as mounted (ConfigMap %q)", args.ConfigFile, cm)
	}
	if _, err := configv1alpha1.ParseExtender(configData(t, objs, fn+"-extender", path.Base(args.ConfigFile))); err != nil {
		t.Errorf("the ExtenderConfiguration the plugin reads: %v", err)
	}
	var hasMetrics bool
	for _, p := range c.Ports {
		hasMetrics = hasMetrics || p.Name == "metrics" && ":"+strconv.Itoa(int(p.ContainerPort)) == args.MetricsBindAddress
	}
	if !hasMetrics {
		t.Errorf("scheduler ports %v lack the core's metrics port %s", c.Ports, args.MetricsBindAddress)
	}
	// Ready means the core decides: its /readyz on the metrics port.
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "metrics" {
		t.Errorf("readinessProbe %+v; want GET /readyz on the metrics port (the core's readiness)", p)
	}
}

// pluginScheduler returns the rendered scheduler Deployment and the
// GPUTopology plugin's args in its configuration.
func pluginScheduler(t *testing.T, objs []*unstructured.Unstructured, fn string) (appsv1.Deployment, schedplugin.Args) {
	t.Helper()
	var dep appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-scheduler"), &dep)
	cfg, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatalf("scheduler ConfigMap: %v", err)
	}
	if len(cfg.Extenders) != 0 || len(cfg.Profiles) != 1 || len(cfg.Profiles[0].PluginConfig) != 1 {
		t.Fatalf("plugin mode scheduler config: extenders %d, profiles %d; want no extender and one profile with the plugin's config", len(cfg.Extenders), len(cfg.Profiles))
	}
	var args schedplugin.Args
	if err := json.Unmarshal(cfg.Profiles[0].PluginConfig[0].Args.Raw, &args); err != nil {
		t.Fatalf("plugin args: %v", err)
	}
	return dep, args
}

// configMapMountedAt names the ConfigMap the container sees at dir.
func configMapMountedAt(spec corev1.PodSpec, c corev1.Container, dir string) (string, bool) {
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name, true
			}
		}
	}
	return "", false
}

// TestRenderedPluginModeSchedulesInProcess: the chart's plugin-mode
// configuration, run by gputopo-scheduler under the chart's scheduler
// service account and RBAC only, with the extender's ConfigMap where the
// chart mounts it, binds a model-parallel pod to NVLinked GPUs with the
// assignment written in the Binding, leaves an impossible pod Pending with
// gputopo's reason, holds its Lease and serves the core's metrics under
// the extender's names.
func TestRenderedPluginModeSchedulesInProcess(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	rel := pluginRelease
	fn := rel.fullname()
	objs := rel.render(t)
	createNamespace(t, cp, rel.namespace)
	applyRBAC(t, cp, objs)
	nodes := createGPUNodes(t, cp)

	// kubelet's part: the ConfigMap as a volume.
	_, args := pluginScheduler(t, objs, fn)
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, path.Base(args.ConfigFile))
	if err := os.WriteFile(cfgFile, configData(t, objs, fn+"-extender", path.Base(args.ConfigFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := "127.0.0.1:" + strconv.Itoa(port)
	schedCfg, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	args.ConfigFile, args.MetricsBindAddress = cfgFile, metricsAddr
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	schedCfg.Profiles[0].PluginConfig[0].Args.Raw = raw
	schedUser, schedGroups := serviceAccountUser(rel.namespace, fn+"-scheduler")
	sched := startSchedulerBinaryAs(t, cp, "gputopo-scheduler", schedCfg, schedUser, schedGroups)

	pod := harness.GPUPod("default", "train-0", 4)
	pod.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	pod.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	impossible := harness.GPUPod("default", "too-big", 8)
	impossible.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	impossible.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"gpuMemoryMiB":10000000}`}
	for _, p := range []*corev1.Pod{pod, impossible} {
		if err := cp.Client.Create(ctx, p); err != nil {
			t.Fatalf("create pod: %v", err)
		}
	}
	got := waitBoundByExtender(t, cp, pod, nodes)
	pl, err := v1alpha1.ParsePlacement(got.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil || pl.Node != got.Spec.NodeName || (pl.Tier != v1alpha1.TierNVSwitch && pl.Tier != v1alpha1.TierNVLink) {
		t.Errorf("placement %q (err %v); want an NVLink set on %s", got.Annotations[v1alpha1.AnnotationPlacement], err, got.Spec.NodeName)
	}
	t.Logf("checked: gputopo-scheduler bound %s to %s with assigned-gpus and placement %s", got.Name, got.Spec.NodeName, pl)

	waited, err := cp.WaitForPod(ctx, impossible.Namespace, impossible.Name, time.Minute, func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, placement.ReasonPrefix) {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("the impossible pod never waited with gputopo's reason: %v", err)
	}
	if waited.Spec.NodeName != "" {
		t.Errorf("the impossible pod was bound to %s", waited.Spec.NodeName)
	}

	// A client on the pod network reaches the scheduler pods' ports: the
	// core's metrics port serves /metrics and nothing else, so there is
	// no verb to call, with or without credentials.
	pending := harness.GPUPod("default", "bind-me", 1)
	pending.Spec.SchedulerName = "nobody" // stays unbound unless someone binds it
	if err := cp.Client.Create(ctx, pending); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/filter", "/prioritize", "/bind", "/scheduler/filter", "/scheduler/prioritize", "/scheduler/bind"} {
		body := `{"podName":"bind-me","podNamespace":"default","podUID":"` + string(pending.UID) + `","node":"dgx-a100-0"}`
		resp, err := http.Post("http://"+metricsAddr+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("POST %s on the core's metrics port answered %s; it must serve no verbs", path, resp.Status)
		}
	}
	var still corev1.Pod
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pending), &still); err != nil || still.Spec.NodeName != "" {
		t.Errorf("after POSTs to the metrics port the pod is on node %q (err %v), want unbound", still.Spec.NodeName, err)
	}

	var lease coordinationv1.Lease
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: rel.namespace, Name: fn + "-scheduler"}, &lease); err != nil || lease.Spec.HolderIdentity == nil {
		t.Errorf("the scheduler's Lease %s/%s-scheduler: %v (holder %v)", rel.namespace, fn, err, lease.Spec.HolderIdentity)
	}
	if ok, why := localcluster.CoreReady(metricsAddr); !ok {
		t.Errorf("the core's /readyz after scheduling: %s", why)
	}
	g, err := localcluster.LedgerGPUs("http://" + metricsAddr + "/metrics")
	if err != nil || g["held"] != 4 || g["total"] != 16 {
		t.Errorf("the core's gputopo_extender_ledger_gpus: %v (err %v); want 4 of 16 held", g, err)
	}
	if t.Failed() {
		t.Logf("gputopo-scheduler log:\n%s", sched.Tail(40))
	}
}
