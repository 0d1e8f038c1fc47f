//go:build integration

package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/test/harness"
)

// criticalQuota is the release's ResourceQuota for critical pods, nil when
// none is rendered.
func criticalQuota(t *testing.T, r release, objs []*unstructured.Unstructured) *corev1.ResourceQuota {
	t.Helper()
	for _, o := range ofKind(objs, "ResourceQuota") {
		if o.GetName() == r.fullname()+"-nodeagent-critical-pods" {
			var q corev1.ResourceQuota
			into(t, o, &q)
			return &q
		}
	}
	return nil
}

// The node agent runs at system-node-critical by default, and wherever
// the chart gives it a system-*-critical class outside kube-system it
// renders the ResourceQuota that lets such pods into the release namespace
// on clusters that limit them to namespaces with a matching quota.
func TestChartRendersNodeAgentPriorityAndCriticalPodsQuota(t *testing.T) {
	for _, tc := range []struct {
		name, namespace, values string
		wantClass               string
		wantQuota               bool
	}{
		{name: "by default system-node-critical, with the quota", namespace: "gputopo-system", wantClass: "system-node-critical", wantQuota: true},
		{name: "system-cluster-critical, with the quota", namespace: "gpu-platform", values: "nodeAgent: {priorityClassName: system-cluster-critical}",
			wantClass: "system-cluster-critical", wantQuota: true},
		{name: "in kube-system no quota is needed", namespace: "kube-system", wantClass: "system-node-critical"},
		{name: "a class of the cluster's own needs no quota", namespace: "gputopo-system", values: "nodeAgent: {priorityClassName: gpu-infra}", wantClass: "gpu-infra"},
		{name: "empty renders no class and no quota", namespace: "gputopo-system", values: `nodeAgent: {priorityClassName: ""}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := release{name: "gputopo", namespace: tc.namespace, values: tc.values}
			objs := r.render(t)
			spec := nodeAgentPodSpec(t, r)
			if spec.PriorityClassName != tc.wantClass {
				t.Errorf("node agent priorityClassName %q, want %q", spec.PriorityClassName, tc.wantClass)
			}
			q := criticalQuota(t, r, objs)
			if (q != nil) != tc.wantQuota {
				t.Fatalf("critical pods ResourceQuota rendered: %v, want %v", q != nil, tc.wantQuota)
			}
			if q == nil {
				return
			}
			sel := q.Spec.ScopeSelector
			if q.Namespace != tc.namespace || sel == nil || len(sel.MatchExpressions) != 1 ||
				sel.MatchExpressions[0].ScopeName != corev1.ResourceQuotaScopePriorityClass ||
				sel.MatchExpressions[0].Operator != corev1.ScopeSelectorOpIn ||
				!slices.Equal(sel.MatchExpressions[0].Values, []string{tc.wantClass}) {
				t.Errorf("ResourceQuota %s/%s scope %+v; want the release namespace, PriorityClass In [%s]", q.Namespace, q.Name, sel, tc.wantClass)
			}
			if pods := q.Spec.Hard[corev1.ResourcePods]; pods.Value() != 5000 {
				t.Errorf("ResourceQuota hard pods %s, want the default nodeAgent.criticalPodsQuota 5000", pods.String())
			}
		})
	}
}

// The agent reads the host's NVIDIA container toolkit configuration
// through a read-only hostPath that a node without one does not fail on,
// and parses the rendered --toolkit-config as the file in that mount.
func TestChartRendersTheToolkitConfigMount(t *testing.T) {
	for _, tc := range []struct {
		name, values, wantDir string
	}{
		{name: "by default the toolkit's packaged directory", wantDir: "/etc/nvidia-container-runtime"},
		{name: "the GPU operator's directory", values: "nodeAgent: {toolkitConfigDir: /usr/local/nvidia/toolkit/.config/nvidia-container-runtime/}",
			wantDir: "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime"},
		{name: "empty: no mount, no check", values: `nodeAgent: {toolkitConfigDir: ""}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := nodeAgentPodSpec(t, release{name: "gputopo", namespace: "gputopo-system", values: tc.values})
			ctr := spec.Containers[0]
			o := nodeDeviceListFlags(t, ctr.Args)
			wantFile := ""
			if tc.wantDir != "" {
				wantFile = tc.wantDir + "/config.toml"
			}
			if o.ToolkitConfig != wantFile {
				t.Errorf("the agent parses --toolkit-config %q from %q, want %q", o.ToolkitConfig, ctr.Args, wantFile)
			}
			var mount *corev1.VolumeMount
			for i, m := range ctr.VolumeMounts {
				if m.Name == "toolkit-config" {
					mount = &ctr.VolumeMounts[i]
				}
			}
			var source *corev1.HostPathVolumeSource
			for _, v := range spec.Volumes {
				if v.Name == "toolkit-config" {
					source = v.HostPath
				}
			}
			if tc.wantDir == "" {
				if mount != nil || source != nil {
					t.Errorf("toolkit-config mounted (%+v from %+v) with toolkitConfigDir empty", mount, source)
				}
				return
			}
			if mount == nil || source == nil {
				t.Fatalf("no toolkit-config mount (%+v) or hostPath volume (%+v)", mount, source)
			}
			if !mount.ReadOnly || mount.MountPath != tc.wantDir || filepath.Dir(wantFile) != mount.MountPath {
				t.Errorf("toolkit-config mount %+v; want read-only at %s, the directory of --toolkit-config", mount, tc.wantDir)
			}
			if source.Path != tc.wantDir || source.Type == nil || *source.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("toolkit-config hostPath %+v; want %s, DirectoryOrCreate (a node without the toolkit must not fail the pod)", source, tc.wantDir)
			}
		})
	}
}

// On a cluster whose kube-apiserver admits pods of the system-*-critical
// classes only in namespaces with a quota for them (ResourceQuota
// limitedResources, as GKE configures it), the agent's pod is refused in
// the release namespace without the chart's ResourceQuota and admitted
// with it: the real kube-apiserver and its quota controller.
func TestChartCriticalAgentAdmittedWhereQuotaLimitsCriticalPods(t *testing.T) {
	dir := t.TempDir()
	admission := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(admission, []byte(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - scopeName: PriorityClass
              operator: In
              values: [system-node-critical, system-cluster-critical]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := harness.Start(t, harness.Options{APIServerArgs: map[string][]string{"admission-control-config-file": {admission}}})
	cp.StartControllerManager(t, "resourcequota-controller")
	harness.InstallThirdPartyCRDs(t, cp)
	ctx := harness.Context(t)
	r := release{name: "gputopo", namespace: "gputopo-system"}
	createNamespace(t, cp, r.namespace)
	// The GPU operator's RuntimeClass, which the agent runs with.
	if err := cp.Client.Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "nvidia"}, Handler: "nvidia"}); err != nil {
		t.Fatal(err)
	}
	objs := r.render(t)
	spec := nodeAgentPodSpec(t, r)
	agentPod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: name}, Spec: *spec.DeepCopy()}
	}

	err := cp.Client.Create(ctx, agentPod("before-quota"), client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "insufficient quota to match these scopes") {
		t.Fatalf("the agent's pod without the chart's quota: %v; want refused for its priority class (is limitedResources in force?)", err)
	}
	t.Logf("checked: without a quota the %s pod is refused: %v", spec.PriorityClassName, err)

	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	q := criticalQuota(t, r, objs)
	if q == nil {
		t.Fatal("the default release renders no critical pods quota")
	}
	for _, o := range ofKind(objs, "ResourceQuota") {
		if err := apply(ctx, cp, dyn, o, false); err != nil {
			t.Fatalf("apply ResourceQuota %s: %v", o.GetName(), err)
		}
	}
	// The quota admits pods once its controller has counted them.
	harness.Poll(t, time.Minute, "the quota's status", func() (bool, string) {
		got := &corev1.ResourceQuota{}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(q), got); err != nil {
			return false, err.Error()
		}
		_, ok := got.Status.Used[corev1.ResourcePods]
		return ok, "no usage yet"
	})
	p := agentPod("with-quota")
	if err := cp.Client.Create(ctx, p); err != nil {
		t.Fatalf("the agent's pod with the chart's quota refused: %v", err)
	}
	if p.Spec.Priority == nil || *p.Spec.Priority < 2000000000 {
		t.Errorf("admitted pod's priority %v; want system-node-critical's", p.Spec.Priority)
	}
	t.Logf("checked: with the chart's ResourceQuota %s the agent's pod is admitted at priority %d", q.Name, *p.Spec.Priority)
}

// NOTES.txt warns loudly when the envvar strategy is chosen, from a real
// `helm install --dry-run=server`, and says nothing of it by default.
func TestChartNotesWarnOfTheEnvvarStrategy(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	harness.InstallThirdPartyCRDs(t, cp)
	kubeconfig := cp.Kubeconfig(t, "gputopo-test-helm", "system:masters")
	const warning = "WARNING: nodeAgent.deviceListStrategy includes envvar"
	for _, tc := range []struct {
		name, values string
		warn         bool
	}{
		{name: "the default cdi-cri: no warning"},
		{name: "envvar: warned", values: "nodeAgent: {deviceListStrategy: envvar}", warn: true},
		{name: "envvar with volume-mounts: warned", values: "nodeAgent: {deviceListStrategy: [volume-mounts, envvar]}", warn: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			out, err := r.helm(t, "install", r.name, chartDir(), "--namespace", r.namespace, "--create-namespace", "--dry-run=server", "--kubeconfig", kubeconfig)
			if err != nil {
				t.Fatalf("helm install --dry-run=server: %v\n%.400s", err, out)
			}
			_, notes, ok := strings.Cut(string(out), "\nNOTES:\n")
			if !ok {
				t.Fatalf("no NOTES in the output:\n%.400s", out)
			}
			if strings.Contains(notes, warning) != tc.warn {
				t.Errorf("NOTES warn of envvar: %v, want %v:\n%s", !tc.warn, tc.warn, notes)
			}
			if tc.warn {
				for _, w := range []string{"any container's\nenvironment (env, or envFrom a ConfigMap or Secret) can then select any GPU",
					"accept-nvidia-visible-devices-envvar-when-unprivileged = false"} {
					if !strings.Contains(notes, w) {
						t.Errorf("the warning does not say %q:\n%s", w, notes)
					}
				}
			}
		})
	}
}
