//go:build integration

package kubectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/placement"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/demo"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/kubectlplugin"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

const ns = "ml-team"

// One node per machine and every workload pinned to its machine: with one
// candidate node per pod, kube-scheduler's random choice among equal
// scores cannot change the picture, so the outputs are stable enough for
// golden files.
var (
	cluster = []demo.NodeSpec{
		{Name: "dgx-a100-1", Fixture: "dgx-a100"},
		{Name: "dgx1-v100-1", Fixture: "dgx1-v100"},
		{Name: "pcie-l40s-1", Fixture: "pcie-8x"},
	}
	workloads = []demo.Workload{
		{Name: "llm-finetune", Intent: v1alpha1.ParallelismModel, Pods: 1, GPUs: 4, Machine: "dgx-a100"},
		{Name: "llm-pretrain", Intent: v1alpha1.ParallelismModel, Pods: 1, GPUs: 4, Machine: "dgx1-v100"},
		{Name: "notebook", Pods: 2, GPUs: 1, Bare: true, Machine: "dgx1-v100"},
		{Name: "resnet", Intent: v1alpha1.ParallelismData, Pods: 2, GPUs: 2, Machine: "pcie-8x"},
	}
)

// unsatisfiable asks every node for more bandwidth per GPU pair than any
// machine has: each node fails gputopo's filter with its own reason.
const unsatisfiable = `{"requireNVLink":true,"minPairBandwidthGBps":5000,"strategy":"highest_bandwidth"}`

func TestKubectlGputopoOnTheDemoCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	ran := false
	err := demo.Run(ctx, demo.Options{
		Cluster: cluster, Workloads: workloads, OutDir: t.TempDir(), Out: &out,
		AfterPlacement: func(ctx context.Context, r demo.Result) error {
			ran = true
			checkPlugin(ctx, t, r.Kubeconfig)
			return nil
		},
	})
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	if !ran {
		t.Fatal("the demo never reached its placements")
	}
	for _, want := range []string{"kubectl gputopo nodes", "export KUBECONFIG="} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the demo's report does not print %q:\n%s", want, out.String())
		}
	}
}

func checkPlugin(ctx context.Context, t *testing.T, kubeconfig string) {
	cs := clientset(t, kubeconfig)
	pending := createUnsatisfiable(ctx, t, cs)
	event := waitFailedScheduling(ctx, t, cs, pending)
	elsewhere := createPinnedNowhere(ctx, t, cs)
	refused := createRefusedJob(ctx, t, cs)
	// What explain prints of each pod is all there before it runs.
	waitShown(ctx, t, cs, "notebook-0", corev1.ConditionTrue, "Scheduled")
	waitShown(ctx, t, cs, pending.Name, corev1.ConditionFalse, "FailedScheduling")
	waitShown(ctx, t, cs, elsewhere.Name, corev1.ConditionFalse, "FailedScheduling")

	goldens := []struct {
		name string
		args []string
	}{
		{"nodes.txt", []string{"nodes"}},
		{"nodes.json", []string{"nodes", "-o", "json"}},
		{"node-dgx1-v100-1.txt", []string{"node", "dgx1-v100-1"}},
		{"node-dgx-a100-1.json", []string{"node", "dgx-a100-1", "-o", "json"}},
		{"pods.txt", []string{"pods", "-n", ns}},
		{"pods.json", []string{"pods", "-A", "-o", "json"}},
		{"explain-bound.txt", []string{"explain", "-n", ns, "notebook-0"}},
		{"explain-bound.json", []string{"explain", "-n", ns, "notebook-0", "-o", "json"}},
		{"explain-pending.txt", []string{"explain", "-n", ns, pending.Name}},
		{"explain-pending.yaml", []string{"explain", ns + "/" + pending.Name, "-o", "yaml"}},
		{"explain-fits.json", []string{"explain", "-n", ns, elsewhere.Name, "-o", "json"}},
	}
	for _, g := range goldens {
		t.Run(g.name, func(t *testing.T) {
			got := plugin(ctx, t, kubeconfig, g.args...)
			if strings.HasPrefix(g.name, "explain-") {
				got = normalizeEvents(t, g.name, got)
			}
			golden(t, g.name, normalize(got))
		})
	}

	t.Run("explain names the reasons of the FailedScheduling event", func(t *testing.T) {
		var e kubectlplugin.Explanation
		if err := json.Unmarshal([]byte(plugin(ctx, t, kubeconfig, "explain", "-n", ns, pending.Name, "-o", "json")), &e); err != nil {
			t.Fatal(err)
		}
		rest := event
		asked := 0
		for _, v := range e.Nodes {
			if v.Scheduler != "" {
				continue // kube-scheduler's own filters left it out; the extender never saw it
			}
			asked++
			if v.Verdict == kubectlplugin.VerdictFits || !strings.HasPrefix(v.Reason, placement.ReasonPrefix) {
				t.Errorf("node %s: verdict %s reason %q; want a gputopo reason", v.Node, v.Verdict, v.Reason)
				continue
			}
			if !strings.Contains(event, v.Reason) {
				t.Errorf("node %s: explain says %q; the FailedScheduling event does not:\n%s", v.Node, v.Reason, event)
			}
			rest = strings.ReplaceAll(rest, v.Reason, "")
		}
		if asked != len(cluster) {
			t.Errorf("explain says %d nodes reach gputopo's filter; want all %d", asked, len(cluster))
		}
		if strings.Contains(rest, placement.ReasonPrefix) {
			t.Errorf("the FailedScheduling event has gputopo reasons explain does not name:\n%s", rest)
		}
	})

	t.Run("explain --job shows the webhook's refusal of the Job's pods", func(t *testing.T) {
		var o kubectlplugin.OwnerExplanation
		if err := json.Unmarshal([]byte(plugin(ctx, t, kubeconfig, "explain", "-n", ns, "--job", refused.job, "-o", "json")), &o); err != nil {
			t.Fatal(err)
		}
		if o.Kind != "Job" || o.Refused < 1 || len(o.Pods) != 0 {
			t.Errorf("explain --job %s: %+v; want the Job, its refusals, no pods", refused.job, o)
		}
		found := false
		for _, e := range o.Events.Items {
			found = found || e.Reason == "FailedCreate" && e.Message == refused.message
		}
		if !found {
			t.Errorf("explain --job %s does not show the FailedCreate event %q: %+v", refused.job, refused.message, o.Events)
		}
		text := plugin(ctx, t, kubeconfig, "explain", "-n", ns, refused.job)
		for _, want := range []string{"Job " + ns + "/" + refused.job, "pod creation(s) failed (FailedCreate)", `admission webhook "vpod.gputopo.io" denied the request`, v1alpha1.EnvVisibleDevices} {
			if !strings.Contains(text, want) {
				t.Errorf("explain %s (no such pod) lacks %q:\n%s", refused.job, want, text)
			}
		}
	})

	t.Run("node --svg draws the demo's picture", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "node.svg")
		plugin(ctx, t, kubeconfig, "node", "dgx1-v100-1", "--svg", path)
		b, err := os.ReadFile(path)
		if err != nil || !bytes.HasPrefix(b, []byte("<svg")) || !bytes.Contains(b, []byte(ns+"/notebook-0")) {
			t.Errorf("%s is not the node's picture with its pods: %v\n%.300s", path, err, b)
		}
	})

	t.Run("kubectl finds the plugin on PATH", func(t *testing.T) {
		kubectl := kubectlBinary(t)
		dir := t.TempDir()
		build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "kubectl-gputopo"), "./cmd/kubectl-gputopo")
		build.Dir = localcluster.RepoRoot()
		if b, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build the plugin: %v\n%s", err, b)
		}
		env := append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)
		run := func(args ...string) string {
			cmd := exec.CommandContext(ctx, kubectl, args...)
			cmd.Env = env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
			}
			return stdout.String()
		}
		if list := run("plugin", "list"); !strings.Contains(list, filepath.Join(dir, "kubectl-gputopo")) {
			t.Errorf("kubectl plugin list does not list %s:\n%s", dir, list)
		}
		got := normalize(run("gputopo", "nodes"))
		want := normalize(plugin(ctx, t, kubeconfig, "nodes"))
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("kubectl gputopo nodes differs from the plugin run directly (-direct +kubectl):\n%s", diff)
		}
		// The pod's GPUs, as kubectl describe shows them: its annotations
		// (the GPUsBound Event is off by default).
		if d := run("describe", "pod", "-n", ns, "notebook-0"); !strings.Contains(d, v1alpha1.AnnotationAssignedGPUs+": GPU-") || !strings.Contains(d, v1alpha1.AnnotationPlacement+":") {
			t.Errorf("kubectl describe pod notebook-0 does not show its %s and %s annotations:\n%s", v1alpha1.AnnotationAssignedGPUs, v1alpha1.AnnotationPlacement, d)
		}
	})
}

// plugin runs kubectl-gputopo in-process with the kubeconfig.
func plugin(ctx context.Context, t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := kubectlplugin.NewCommand(&out, &errOut)
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig))
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("kubectl gputopo %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String()
}

func clientset(t *testing.T, kubeconfig string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func createUnsatisfiable(ctx context.Context, t *testing.T, cs kubernetes.Interface) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "too-fast", Annotations: map[string]string{v1alpha1.AnnotationRequirement: unsatisfiable}},
		Spec:       localcluster.GPUPodSpec(2),
	}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the unsatisfiable pod: %v", err)
	}
	if p.Spec.SchedulerName != v1alpha1.DefaultSchedulerName {
		t.Fatalf("the webhook did not route %s to %s (schedulerName %q)", p.Name, v1alpha1.DefaultSchedulerName, p.Spec.SchedulerName)
	}
	return p
}

// createPinnedNowhere creates a model-parallel pod that gputopo could place
// (the A100's free NVSwitch half) but whose node selector matches no node:
// explain shows the GPUs it would take and what keeps kube-scheduler away.
func createPinnedNowhere(ctx context.Context, t *testing.T, cs kubernetes.Interface) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pinned-nowhere", Annotations: map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}},
		Spec:       localcluster.GPUPodSpec(4),
	}
	p.Spec.NodeSelector = map[string]string{"pool": "none"}
	p, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s: %v", p.Name, err)
	}
	return p
}

// waitShown waits until the pod's PodScheduled condition has the status
// and it has events of each reason.
func waitShown(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string, status corev1.ConditionStatus, reasons ...string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		set := false
		for _, c := range p.Status.Conditions {
			set = set || c.Type == corev1.PodScheduled && c.Status == status
		}
		if !set {
			return false, nil
		}
		sel := fields.Set{"involvedObject.name": p.Name, "involvedObject.uid": string(p.UID)}.AsSelector().String()
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		for _, r := range reasons {
			if !slices.ContainsFunc(evs.Items, func(e corev1.Event) bool { return e.Reason == r }) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s: no PodScheduled=%s with events %v: %v", name, status, reasons, err)
	}
}

type refusedJob struct{ job, message string }

// createRefusedJob creates a Job whose GPU container sets
// NVIDIA_VISIBLE_DEVICES (as NVIDIA's examples do): the Job is admitted,
// its pods are refused by the webhook, and the job controller records each
// refusal as a FailedCreate event on the Job. It returns the event's
// message.
func createRefusedJob(ctx context.Context, t *testing.T, cs kubernetes.Interface) refusedJob {
	t.Helper()
	spec := localcluster.GPUPodSpec(1)
	spec.Containers[0].Env = []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: "all"}}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sets-devices"},
		Spec:       batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: corev1.PodTemplateSpec{Spec: spec}},
	}
	job, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create job %s: %v", job.Name, err)
	}
	sel := fields.Set{"involvedObject.kind": "Job", "involvedObject.name": job.Name, "reason": "FailedCreate"}.AsSelector().String()
	var msg string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "denied the request") {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no FailedCreate event with the webhook's denial on job %s: %v", job.Name, err)
	}
	return refusedJob{job: job.Name, message: msg}
}

// waitFailedScheduling returns the message of the pod's FailedScheduling
// event once kube-scheduler has asked the extender.
func waitFailedScheduling(ctx context.Context, t *testing.T, cs kubernetes.Interface, p *corev1.Pod) string {
	t.Helper()
	sel := fields.Set{"involvedObject.name": p.Name, "involvedObject.uid": string(p.UID), "reason": "FailedScheduling"}.AsSelector().String()
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := cs.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, placement.ReasonPrefix) {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no FailedScheduling event with gputopo's reasons for %s: %v", p.Name, err)
	}
	return msg
}

// kubectlBinary is bin/kubectl (make kubectl), else kubectl on PATH.
func kubectlBinary(t *testing.T) string {
	t.Helper()
	p := filepath.Join(localcluster.BinDir(), "kubectl")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	p, err := exec.LookPath("kubectl")
	if errors.Is(err, exec.ErrNotFound) {
		t.Skip("no kubectl in bin/ or on PATH: run make kubectl")
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var normalizers = []struct {
	re   *regexp.Regexp
	with string
}{
	// Job pods' generated name suffixes.
	{regexp.MustCompile(`\b((?:llm-finetune|llm-pretrain|resnet)-)[a-z0-9]{5}\b`), "${1}xxxxx"},
	// Times and ages: the last column of the nodes table, "observed ... ago",
	// and the JSON fields.
	{regexp.MustCompile(`(?m)(fresh|stale[^\n]*\))( +)\S+(?: +(\S+))?$`), "${1}${2}AGE ${3}"},
	{regexp.MustCompile(`observed \S+ ago`), "observed AGE ago"},
	{regexp.MustCompile(`("observedTime": |observedTime: )"?[0-9TZ:.-]+"?`), "${1}TIME"},
	{regexp.MustCompile(`("ageSeconds": |ageSeconds: )\d+`), "${1}0"},
	// Scores follow telemetry and the scoring weights; the tests of the
	// extender pin them, these files pin the picture.
	{regexp.MustCompile(`("score": |score: |score )\d+`), "${1}N"},
	// explain's PodScheduled age.
	{regexp.MustCompile(`(?m)^(PodScheduled: [^\n]*?, )\S+ ago`), "${1}AGE ago"},
}

// normalizeEvents makes explain's events comparable: kube-scheduler's
// retries add FailedScheduling events (or grow a series) at their own
// pace, so each distinct event is kept once, without times and counts. The
// JSON and YAML outputs are decoded and encoded again as the plugin
// encodes them.
func normalizeEvents(t *testing.T, name, out string) string {
	t.Helper()
	if !strings.HasSuffix(name, ".json") && !strings.HasSuffix(name, ".yaml") {
		return eventsBlockRE.ReplaceAllStringFunc(out, func(block string) string {
			lines := strings.Split(strings.TrimSuffix(block, "\n"), "\n")
			var rows []string
			for _, l := range lines[2:] {
				m := eventRowRE.FindStringSubmatch(l)
				if m == nil {
					t.Fatalf("event row %q", l)
				}
				if r := "  " + m[1] + " " + m[2] + " from " + m[3] + ": " + m[4]; !slices.Contains(rows, r) {
					rows = append(rows, r)
				}
			}
			return "events:       (distinct)\n" + strings.Join(rows, "\n") + "\n"
		})
	}
	data := []byte(out)
	if strings.HasSuffix(name, ".yaml") {
		var err error
		if data, err = yaml.YAMLToJSON(data); err != nil {
			t.Fatal(err)
		}
	}
	var e kubectlplugin.Explanation
	if err := json.Unmarshal(data, &e); err != nil {
		t.Fatal(err)
	}
	if c := e.Scheduled; c != nil {
		c.LastTransitionTime, c.AgeSeconds = nil, 0
	}
	var items []kubectlplugin.EventView
	for _, ev := range e.Events.Items {
		ev.Count, ev.FirstSeen, ev.LastSeen, ev.AgeSeconds = 0, nil, nil, 0
		if !slices.Contains(items, ev) {
			items = append(items, ev)
		}
	}
	e.Events.Items, e.Events.Omitted = items, 0
	b, err := json.MarshalIndent(e, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(name, ".yaml") {
		if b, err = yaml.JSONToYAML(b); err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	return string(b) + "\n"
}

var (
	eventsBlockRE = regexp.MustCompile(`(?m)^events: +\d+, oldest first.*\n  TYPE .*\n(?:  (?:Normal|Warning) .*\n)+`)
	eventRowRE    = regexp.MustCompile(`^  (Normal|Warning) +(\S+) +\S+(?: \(x\d+ over \S+\))? +(\S+) +(.*)$`)
)

func normalize(s string) string {
	for _, n := range normalizers {
		s = n.re.ReplaceAllString(s, n.with)
	}
	return s
}

// golden compares got with testdata/name; -update rewrites it.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-want +got); if the change is intended, rerun with -update:\n%s", name, diff)
	}
}
