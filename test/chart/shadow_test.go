//go:build integration

package chart

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/extender"
)

// extenderOptions parses the arguments of an extender container into the
// extender's own Options and validates them as `gputopo extender` does
// before it starts.
func extenderOptions(t *testing.T, what string, args []string) extender.Options {
	t.Helper()
	if len(args) == 0 || args[0] != "extender" {
		t.Fatalf("%s: args %q do not start with the extender subcommand", what, args)
	}
	o := extender.NewOptions()
	fs := pflag.NewFlagSet(what, pflag.ContinueOnError)
	o.AddFlags(fs)
	// --v is klog's, added by the root command (checkDeploymentArgs parses
	// the args with it).
	fs.Int("v", 0, "klog verbosity")
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("%s: args %q: %v", what, args, err)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("%s: args %q are refused by the extender: %v", what, args, err)
	}
	return o
}

// checkShadowExtender: without shadowExtender.enabled nothing of a shadow
// is rendered and the serving extender mirrors nowhere. With it, the
// serving extender mirrors to the shadow's Service, the shadow runs with
// --shadow and without leader election on its own configuration, and no
// selector of the serving extender reaches shadow pods (the scheduler must
// never call a shadow).
func checkShadowExtender(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	var serving appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-extender"), &serving)
	servingArgs := serving.Spec.Template.Spec.Containers[0].Args
	servingOpts := extenderOptions(t, "serving extender", servingArgs)

	if !w.shadow {
		for _, o := range objs {
			if o.GetLabels()["app.kubernetes.io/component"] == "extender-shadow" || strings.Contains(o.GetName(), "shadow") {
				t.Errorf("shadowExtender is off, yet %s %s is rendered", o.GetKind(), o.GetName())
			}
		}
		if slices.ContainsFunc(servingArgs, func(a string) bool { return strings.HasPrefix(a, "--shadow") }) {
			t.Errorf("shadowExtender is off and extender.shadow.url empty, yet the serving extender args %q mirror", servingArgs)
		}
		return
	}

	name := fn + "-extender-shadow"
	var svc corev1.Service
	into(t, find(t, objs, "Service", name), &svc)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != extender.DefaultPort || svc.Spec.Ports[0].TargetPort.StrVal != scheme(w) {
		t.Fatalf("shadow Service ports = %s, want %d -> %s", mustYAML(svc.Spec.Ports), extender.DefaultPort, scheme(w))
	}
	url := fmt.Sprintf("%s://%s.%s.svc:%d", scheme(w), svc.Name, r.namespace, svc.Spec.Ports[0].Port)
	if servingOpts.ShadowURL != url || servingOpts.ShadowSampleRate != 1 || servingOpts.ShadowTimeout != 2*time.Second {
		t.Errorf("serving extender mirrors to %q (sample rate %g, timeout %s), want %q (1, 2s); args %q",
			servingOpts.ShadowURL, servingOpts.ShadowSampleRate, servingOpts.ShadowTimeout, url, servingArgs)
	}

	var shadow appsv1.Deployment
	into(t, find(t, objs, "Deployment", name), &shadow)
	pod := shadow.Spec.Template
	ctr := pod.Spec.Containers[0]
	opts := extenderOptions(t, "shadow extender", ctr.Args)
	if !slices.Contains(ctr.Args, "--shadow") || !opts.Shadow {
		t.Errorf("shadow extender args %q lack --shadow", ctr.Args)
	}
	if slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, "--leader-elect") }) || opts.LeaderElect {
		t.Errorf("shadow extender args %q elect a leader; every shadow replica answers", ctr.Args)
	}
	if opts.ShadowLogSampleRate != w.shadowLogRate || opts.ShadowURL != "" {
		t.Errorf("shadow extender: log sample rate %g, shadow URL %q; want %g and none", opts.ShadowLogSampleRate, opts.ShadowURL, w.shadowLogRate)
	}
	if opts.Port != extender.DefaultPort || !slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool {
		return p.Name == scheme(w) && p.ContainerPort == int32(opts.Port)
	}) {
		t.Errorf("shadow extender listens on %d, container ports %s; the Service targets %s", opts.Port, mustYAML(ctr.Ports), scheme(w))
	}
	if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("shadow readiness probe = %s, want GET /readyz", mustYAML(p))
	}
	if p := ctr.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("shadow liveness probe = %s, want GET /healthz", mustYAML(p))
	}

	// It reads the shadow ConfigMap, mounted where --config points.
	var mount *corev1.VolumeMount
	for i, m := range ctr.VolumeMounts {
		if m.MountPath == path.Dir(opts.ConfigFile) {
			mount = &ctr.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("shadow extender --config=%s is not on a mounted volume: %s", opts.ConfigFile, mustYAML(ctr.VolumeMounts))
	}
	i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == mount.Name })
	if i < 0 || pod.Spec.Volumes[i].ConfigMap == nil || pod.Spec.Volumes[i].ConfigMap.Name != name {
		t.Errorf("shadow extender mounts %s, want ConfigMap %s", mustYAML(pod.Spec.Volumes), name)
	}
	checkExtenderConfigMap(t, objs, name, w.shadowWeights, w.prometheus, w.resourceName)

	// Same identity and the same restrictions as the serving extender.
	if pod.Spec.ServiceAccountName != serving.Spec.Template.Spec.ServiceAccountName {
		t.Errorf("shadow runs as %q, the serving extender as %q", pod.Spec.ServiceAccountName, serving.Spec.Template.Spec.ServiceAccountName)
	}
	find(t, objs, "ServiceAccount", pod.Spec.ServiceAccountName)
	if diff := cmp.Diff(serving.Spec.Template.Spec.SecurityContext, pod.Spec.SecurityContext); diff != "" {
		t.Errorf("shadow pod securityContext (-serving +shadow):\n%s", diff)
	}
	if diff := cmp.Diff(serving.Spec.Template.Spec.Containers[0].SecurityContext, ctr.SecurityContext); diff != "" {
		t.Errorf("shadow container securityContext (-serving +shadow):\n%s", diff)
	}
	if ptr.Deref(shadow.Spec.Replicas, 0) != 1 {
		t.Errorf("shadow replicas = %d, want 1", ptr.Deref(shadow.Spec.Replicas, 0))
	}

	// The shadow Service and Deployment select shadow pods; nothing of the
	// serving extender does, nor the other way round.
	if !labelsMatch(svc.Spec.Selector, pod.Labels) || !labelsMatch(shadow.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("shadow Service selector %v or Deployment selector %v does not select shadow pods %v", svc.Spec.Selector, shadow.Spec.Selector.MatchLabels, pod.Labels)
	}
	var servingSvc, servingMetrics corev1.Service
	into(t, find(t, objs, "Service", fn+"-extender"), &servingSvc)
	into(t, find(t, objs, "Service", fn+"-extender-metrics"), &servingMetrics)
	var pdb policyv1.PodDisruptionBudget
	into(t, find(t, objs, "PodDisruptionBudget", fn+"-extender"), &pdb)
	for what, sel := range map[string]map[string]string{
		"serving extender Service":             servingSvc.Spec.Selector,
		"serving extender metrics Service":     servingMetrics.Spec.Selector,
		"serving extender Deployment":          serving.Spec.Selector.MatchLabels,
		"serving extender PodDisruptionBudget": pdb.Spec.Selector.MatchLabels,
	} {
		if labelsMatch(sel, pod.Labels) {
			t.Errorf("%s selector %v selects shadow pods %v", what, sel, pod.Labels)
		}
	}
	if labelsMatch(svc.Spec.Selector, serving.Spec.Template.Labels) || labelsMatch(shadow.Spec.Selector.MatchLabels, serving.Spec.Template.Labels) {
		t.Errorf("shadow selectors select serving extender pods %v", serving.Spec.Template.Labels)
	}
}

// helm upgrade --reuse-values renders the new chart with the values of the
// chart a release was installed from, which lack extender.telemetry,
// extender.shadow, shadowExtender, extender.tls, networkPolicy and
// gpuResourceName, and have nodeAgent.resourceName and the scheduler tag
// pinned as that chart did: the release must render as with the new
// defaults (TLS on).
func TestChartRendersValuesWithoutTelemetryOrShadowAsDefaults(t *testing.T) {
	old := defaultRelease
	old.values = "extender: {telemetry: null, shadow: null, tls: null}\nshadowExtender: null\nnetworkPolicy: null\n" +
		"gpuResourceName: null\nnodeAgent: {resourceName: nvidia.com/gpu}\nscheduler: {image: {tag: v1.37.2}}\n"
	want, got := defaultRelease.render(t), old.render(t)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("render without the new values (-defaults +without):\n%s", diff)
	}
}
