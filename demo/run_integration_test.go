//go:build integration

package demo

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
)

// `make demo` must work from a fresh clone: this runs the same Run on the
// default cluster and workloads and checks that every workload was placed
// under both schedulers, that the per-job table says what the bound pods
// of each cluster say (nodes, and GPUs from gputopo's assignment or the
// device plugin's record), that both pictures came out, that the
// high-priority job preempted under both and got NVLink-connected GPUs
// from gputopo, and that gputopo's pace is not below plain
// kube-scheduler's on the geometric mean.
// It runs in both modes (`gputopo demo` and `gputopo demo --mode plugin`).
func TestDemoComparesGputopoWithPlainKubeScheduler(t *testing.T) {
	for _, mode := range []string{ModeExtender, ModePlugin} {
		t.Run(mode, func(t *testing.T) { testDemo(t, mode) })
	}
}

func testDemo(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var out bytes.Buffer
	dir := t.TempDir()
	var res Result
	err := Run(ctx, Options{OutDir: dir, Out: &out, Mode: mode, AfterPlacement: func(ctx context.Context, r Result) error {
		res = r
		for _, side := range []struct {
			name, kubeconfig, annotation string
			of                           func(JobRow) JobPlacement
		}{
			{SchedulerGPUTopo, r.Kubeconfig, v1alpha1.AnnotationAssignedGPUs, func(j JobRow) JobPlacement { return j.GPUTopo }},
			{SchedulerPlain, r.PlainKubeconfig, AnnotationDevicePluginGPUs, func(j JobRow) JobPlacement { return j.Plain }},
		} {
			if err := checkAgainstPods(ctx, side.kubeconfig, side.annotation, r.Jobs, side.of); err != nil {
				return fmt.Errorf("%s: %w", side.name, err)
			}
		}
		return nil
	}})
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log(text)
	if len(res.Jobs) != len(DefaultWorkloads) {
		t.Fatalf("%d jobs in the result, want %d", len(res.Jobs), len(DefaultWorkloads))
	}
	logSum, n := 0.0, 0
	for _, j := range res.Jobs {
		w := j.Workload
		for _, jp := range []JobPlacement{j.GPUTopo, j.Plain} {
			if len(jp.Pods) != w.Pods {
				t.Errorf("%s: %d pods placed, want %d", w.Name, len(jp.Pods), w.Pods)
			}
			if !strings.Contains(text, where(jp)) {
				t.Errorf("%s: the table does not show %q", w.Name, where(jp))
			}
		}
		if g, p := j.GPUTopo.PaceGBps, j.Plain.PaceGBps; g > 0 && p > 0 {
			logSum += math.Log(float64(g) / float64(p))
			n++
		}
		if w.Priority == PriorityServing {
			if j.GPUTopo.Preempted == 0 || j.Plain.Preempted == 0 {
				t.Errorf("%s preempted %d pods under gputopo and %d under plain kube-scheduler; the cluster is full, want both > 0", w.Name, j.GPUTopo.Preempted, j.Plain.Preempted)
			}
			if j.GPUTopo.PaceGBps < 50 {
				t.Errorf("%s under gputopo: pace %d GB/s, want an NVLink-connected set (≥ 50 GB/s)", w.Name, j.GPUTopo.PaceGBps)
			}
		}
	}
	if n == 0 || logSum < 0 {
		t.Errorf("gputopo's pace over plain kube-scheduler's: geometric mean %.2f over %d jobs, want ≥ 1", math.Exp(logSum/float64(max(n, 1))), n)
	}
	if !strings.Contains(text, Headline(res.Jobs)) {
		t.Errorf("the headline is not printed")
	}
	for _, f := range []string{"placement.svg", "placement-plain.svg"} {
		svg, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) {
			t.Errorf("%s missing or not SVG: %v", f, err)
		}
	}
}

// checkAgainstPods compares one scheduler's side of the table with the
// pods of its cluster: a pod still placed is bound to its row's node and
// holds its row's GPUs (annotation); a preempted one is gone.
func checkAgainstPods(ctx context.Context, kubeconfig, annotation string, jobs []JobRow, of func(JobRow) JobPlacement) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: localcluster.Scheme()})
	if err != nil {
		return err
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(demoNamespace)); err != nil {
		return err
	}
	byName := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byName[pods.Items[i].Name] = &pods.Items[i]
	}
	for _, j := range jobs {
		for _, p := range of(j).Pods {
			pod := byName[p.Name]
			if p.Evicted {
				if pod != nil && pod.DeletionTimestamp == nil {
					return fmt.Errorf("pod %s is shown preempted but is still there", p.Name)
				}
				continue
			}
			if pod == nil {
				return fmt.Errorf("pod %s of the table is not in the cluster", p.Name)
			}
			if pod.Spec.NodeName != p.Node {
				return fmt.Errorf("pod %s is on %s; the table says %s", p.Name, pod.Spec.NodeName, p.Node)
			}
			uuids, err := v1alpha1.ParseGPUList(annotation, pod.Annotations[annotation])
			if err != nil {
				return fmt.Errorf("pod %s: %w", p.Name, err)
			}
			if !slices.Equal(uuids, p.UUIDs) {
				return fmt.Errorf("pod %s holds %v; the table says %v", p.Name, uuids, p.UUIDs)
			}
		}
	}
	return nil
}
