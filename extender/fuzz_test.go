package extender

import (
	"bytes"
	"context"
	"testing"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// FuzzDecode feeds arbitrary bodies to the request decoders and, when they
// accept one, to filter and prioritize: no input may panic, and an accepted
// request always has a pod and a node list.
func FuzzDecode(f *testing.F) {
	for _, seed := range []string{
		`{"Pod":{"metadata":{"name":"p","annotations":{"gputopo.io/gpu-topology-requirement":"{\"requireNVLink\":true}"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"4"}}}]}},"NodeNames":["a","b"]}`,
		`{"Pod":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"-3"}}}]}},"Nodes":{"items":[{"metadata":{"name":"a"}}]}}`,
		`{"Pod":{"spec":{"initContainers":[{"resources":{"requests":{"nvidia.com/gpu":"1e9"}}}]}},"NodeNames":[]}`,
		`{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"a"}`,
		`{"Pod":null,"NodeNames":null}`,
		`[]`, `{`, `""`, `{"Pod":{}}{}`,
	} {
		f.Add([]byte(seed))
	}
	x, _ := newTestExtender(f, nil)
	x.core.Feed().UpsertTopology(topo(f, "dgx1-v100", "a"))
	f.Fuzz(func(t *testing.T, body []byte) {
		args, err := DecodeExtenderArgs(bytes.NewReader(body))
		if err == nil {
			if args.Pod == nil || (args.NodeNames == nil && args.Nodes == nil) {
				t.Fatalf("accepted a request without pod or nodes: %s", body)
			}
			res := x.Filter(context.Background(), args)
			if res.Error == "" && res.NodeNames == nil && res.Nodes == nil {
				t.Fatalf("filter returned neither nodes nor an error for %s", body)
			}
			if list, err := x.Prioritize(context.Background(), args); err == nil {
				for _, h := range list {
					if h.Score < extenderv1.MinExtenderPriority || h.Score > extenderv1.MaxExtenderPriority {
						t.Fatalf("score %d out of range", h.Score)
					}
				}
			}
		}
		if b, err := DecodeBindingArgs(bytes.NewReader(body)); err == nil && (b.PodName == "" || b.Node == "") {
			t.Fatalf("accepted a binding without pod or node: %s", body)
		}
	})
}
