//go:build integration

package chart

import (
	"slices"
	"strings"
	"testing"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/test/harness"
)

// checkResourceName: every component is given the one GPU resource name,
// read back by each component's own flag set or configuration decoder.
func checkResourceName(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	got := renderedResourceNames(t, r, w, objs)
	for component, name := range got {
		if name != w.resourceName {
			t.Errorf("%s is given resource %q, want %q", component, name, w.resourceName)
		}
	}
}

// renderedResourceNames returns the GPU resource name each component of a
// rendered release reads.
func renderedResourceNames(t *testing.T, r release, w want, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	fn := r.fullname()
	out := map[string]string{}

	var ds appsv1.DaemonSet
	into(t, find(t, objs, "DaemonSet", fn+"-nodeagent"), &ds)
	args := ds.Spec.Template.Spec.Containers[0].Args
	var agent nodeagent.Options
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	agent.AddFlags(fs)
	fs.Int("v", 0, "klog verbosity")
	if len(args) == 0 || fs.Parse(args[1:]) != nil {
		t.Fatalf("node agent args %q do not parse", args)
	}
	out["node agent (--resource-name)"] = agent.ResourceName

	sched, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatalf("scheduler ConfigMap: %v", err)
	}
	for _, e := range sched.Extenders {
		for _, m := range e.ManagedResources {
			out["scheduler (managedResources)"] = m.Name
		}
	}

	configMaps := []string{fn + "-extender"}
	if w.shadow {
		configMaps = append(configMaps, fn+"-extender-shadow")
	}
	for _, name := range configMaps {
		cfg, err := configv1alpha1.ParseExtender(configData(t, objs, name, "config.yaml"))
		if err != nil {
			t.Fatalf("ConfigMap %s: %v", name, err)
		}
		out["ExtenderConfiguration "+name+" (resourceName)"] = cfg.ResourceName
	}

	wh, err := configv1alpha1.ParseWebhook(configData(t, objs, fn+"-webhook", "config.yaml"))
	if err != nil {
		t.Fatalf("webhook ConfigMap: %v", err)
	}
	out["WebhookConfiguration (resourceName)"] = wh.ResourceName
	return out
}

// One value names the GPU resource for every component; the deprecated
// nodeAgent.resourceName still does when gpuResourceName is left alone.
func TestEveryComponentGetsTheGPUResourceName(t *testing.T) {
	for name, tc := range map[string]struct {
		values, want string
	}{
		"gpuResourceName":                       {"gpuResourceName: example.com/gpu", "example.com/gpu"},
		"deprecated nodeAgent.resourceName":     {"nodeAgent: {resourceName: example.com/gpu}", "example.com/gpu"},
		"both, naming the same resource":        {"gpuResourceName: example.com/gpu\nnodeAgent: {resourceName: example.com/gpu}", "example.com/gpu"},
		"neither: the chart's default":          {"", "nvidia.com/gpu"},
		"with a shadow extender and plain HTTP": {"gpuResourceName: amd.com/gpu\nshadowExtender: {enabled: true}\nextender: {tls: {enabled: false}}", "amd.com/gpu"},
	} {
		t.Run(name, func(t *testing.T) {
			rel := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			w := want{resourceName: tc.want, shadow: strings.Contains(tc.values, "shadowExtender")}
			got := renderedResourceNames(t, rel, w, rel.render(t))
			components := make([]string, 0, len(got))
			for c, n := range got {
				components = append(components, c)
				if n != tc.want {
					t.Errorf("%s is given %q, want %q", c, n, tc.want)
				}
			}
			// Every component reads it: node agent, scheduler, extender(s),
			// webhook.
			if len(got) != 4+btoi(w.shadow) {
				slices.Sort(components)
				t.Errorf("resource name read by %q, want the node agent, the scheduler, every extender and the webhook", components)
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
