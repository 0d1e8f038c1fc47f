package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gputopo/gputopo/placement"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// benchCluster is n nodes of three machine types, a quarter of them with
// some GPUs held, like a busy cluster: most nodes share a (topology, free
// GPUs) answer, some do not.
func benchCluster(b testing.TB, n int) (*Extender, []string) {
	b.Helper()
	x, _ := newTestExtender(b, nil)
	fixtures := []string{"dgx1-v100", "dgx-a100", "hgx-h100"}
	names := make([]string, n)
	for i := range names {
		name := fmt.Sprintf("gpu-node-%05d", i)
		names[i] = name
		x.core.Feed().UpsertTopology(withTelemetry(topo(b, fixtures[i%len(fixtures)], name), int32(i%100), 40+int32(i%30), 200, 400))
		x.core.Feed().UpsertNode(gpuNode(name, 8))
		if i%4 == 0 {
			holdOn(x, "held-"+name, name, i%8, (i+3)%8)
		}
	}
	return x, names
}

func benchArgs(names []string) *extenderv1.ExtenderArgs {
	pod := makePod("bench").gpus(4).req(modelParallel).job("train").obj()
	// Created a minute ago: a model-parallel pod still in its patience
	// (docs/extender.md, "Waiting for a faster set").
	pod.CreationTimestamp = metav1.NewTime(testNow.Add(-time.Minute))
	ns := append([]string(nil), names...)
	return &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &ns}
}

var benchSizes = []int{100, 1000, 5000}

// BenchmarkFilterPrioritize is the extender's own work for one pod: filter
// then prioritize over the candidate names, on decoded arguments.
func BenchmarkFilterPrioritize(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			x, names := benchCluster(b, n)
			args := benchArgs(names)
			b.ReportAllocs()
			for b.Loop() {
				res := x.Filter(context.Background(), args)
				if _, err := x.Prioritize(context.Background(), &extenderv1.ExtenderArgs{Pod: args.Pod, NodeNames: res.NodeNames}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHTTPFilterPrioritize is the same through the HTTP handlers:
// decode, decide, encode.
func BenchmarkHTTPFilterPrioritize(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			x, names := benchCluster(b, n)
			httpFilterPrioritize(b, x.Handler(), names)
		})
	}
}

// httpFilterPrioritize runs filter then prioritize through h per iteration.
func httpFilterPrioritize(b *testing.B, h http.Handler, names []string) {
	body, _ := json.Marshal(benchArgs(names))
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/filter", bytes.NewReader(body)))
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || res.Error != "" {
			b.Fatalf("filter: %v %s", err, res.Error)
		}
		pbody, _ := json.Marshal(extenderv1.ExtenderArgs{Pod: benchArgs(nil).Pod, NodeNames: res.NodeNames})
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/prioritize", bytes.NewReader(pbody)))
		if rec.Code != http.StatusOK {
			b.Fatalf("prioritize: %d", rec.Code)
		}
	}
}

// BenchmarkHTTPShadowMirror is BenchmarkHTTPFilterPrioritize with the
// mirror off (the baseline), and mirroring every request to a shadow that
// refuses connections, one that accepts and never answers (the queue fills
// and requests are dropped), and a shadow extender that answers (on the
// same CPUs, so its work competes with the serving extender's here; in a
// cluster it runs in its own pod).
func BenchmarkHTTPShadowMirror(b *testing.B) {
	const n = 1000
	// A refused shadow is logged, as it should be: not into the results.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	b.Cleanup(func() { klog.LogToStderr(true) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close()
	hole := newBlackhole(b)
	shadow, _ := benchCluster(b, n)
	shadow.opts.Shadow = true
	shadow.shadowLog = &decisionLog{rate: 0}
	up := httptest.NewServer(shadow.Handler())
	b.Cleanup(up.Close)
	for _, tc := range []struct{ name, url string }{
		{"off", ""}, {"shadow-refuses", refused}, {"shadow-hangs", hole.srv.URL}, {"shadow-up", up.URL},
	} {
		b.Run("mirror="+tc.name, func(b *testing.B) {
			x, names := benchCluster(b, n)
			if tc.url != "" {
				attachMirror(b, x, tc.url)
			}
			httpFilterPrioritize(b, x.Handler(), names)
		})
	}
}

// BenchmarkBaselineDecodeEncode is the floor any extender pays for the same
// two calls: decode the request and encode an answer of the same size
// (every node passes, every score 0), with no decision at all.
func BenchmarkBaselineDecodeEncode(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			_, names := benchCluster(b, n)
			body, _ := json.Marshal(benchArgs(names))
			b.ReportAllocs()
			for b.Loop() {
				for range 2 {
					args, err := DecodeExtenderArgs(bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					list := make(extenderv1.HostPriorityList, len(*args.NodeNames))
					for i, name := range *args.NodeNames {
						list[i].Host = name
					}
					var buf bytes.Buffer
					if err := json.NewEncoder(&buf).Encode(&extenderv1.ExtenderFilterResult{NodeNames: args.NodeNames}); err != nil {
						b.Fatal(err)
					}
					if err := json.NewEncoder(&buf).Encode(list); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkCycleFilterNode is the plugin build's filter for one pod: a
// cycle, then FilterNode on every node from 1 or 16 goroutines through
// the parallelizer kube-scheduler filters with (client-go's
// workqueue.ParallelizeUntil, its chunk size), then Score over the
// passed nodes.
// Compare with BenchmarkFilterPrioritize, the same decisions in one pass.
func BenchmarkCycleFilterNode(b *testing.B) {
	benchCycle(b, true)
}

// BenchmarkCycleFilter is BenchmarkCycleFilterNode without Score: the part
// the framework runs in parallel, so that 16 goroutines against 1 show
// whether filter scales (at most by the machine's cores).
func BenchmarkCycleFilter(b *testing.B) {
	benchCycle(b, false)
}

func benchCycle(b *testing.B, score bool) {
	pods := []struct{ name, req string }{
		// Nodes of one machine type with the same free GPUs share one
		// answer: most of a node's filter is the lookup.
		{"model", modelParallel},
		// balanced_utilization reads each node's telemetry: the
		// allocator decides every node.
		{"balanced", `{"strategy":"balanced_utilization"}`},
	}
	for _, pod := range pods {
		for _, n := range benchSizes {
			for _, workers := range []int{1, 16} {
				benchCycleOne(b, score, pod.name, pod.req, n, workers)
			}
		}
	}
}

func benchCycleOne(b *testing.B, score bool, podName, req string, n, workers int) {
	{
		{
			b.Run(fmt.Sprintf("pod=%s/nodes=%d/goroutines=%d", podName, n, workers), func(b *testing.B) {
				x, names := benchCluster(b, n)
				args := benchArgs(names)
				args.Pod = makePod("bench").gpus(4).req(req).job("train").obj()
				ctx := context.Background()
				b.ReportAllocs()
				for b.Loop() {
					plan := x.core.PreFilter(ctx, placement.PreFilterInput{Pod: args.Pod, Nodes: len(names)})
					if plan.Cycle == nil {
						b.Fatalf("no cycle: %+v", plan)
					}
					c := plan.Cycle
					passed := make([]bool, len(names))
					workqueue.ParallelizeUntil(ctx, workers, len(names), func(i int) {
						passed[i], _, _ = c.FilterNode(names[i])
					}, workqueue.WithChunkSize(chunkSize(len(names), workers)))
					if !score {
						continue
					}
					feasible := make([]string, 0, len(names))
					for i, ok := range passed {
						if ok {
							feasible = append(feasible, names[i])
						}
					}
					c.Score(feasible)
				}
			})
		}
	}
}

// chunkSize is kube-scheduler's parallelizer's chunk for n pieces over
// workers: the square root of n, at most n/workers + 1, at least 1.
func chunkSize(n, workers int) int {
	s := int(math.Sqrt(float64(n)))
	if r := n/workers + 1; r < s {
		s = r
	}
	return max(s, 1)
}
