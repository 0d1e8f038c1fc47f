package extender

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// The evaluator logs through the request's logger: at verbosity 5 every
// node's verdict with its reason, nothing below it.
func TestEvaluatorLogsThroughTheContext(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "a"))
	x.core.Feed().UpsertTopology(topo(t, "pcie-8x", "b"))
	pod := makePod("p").gpus(4).req(modelParallel).obj()
	names := []string{"a", "b"}
	for _, tc := range []struct {
		verbosity int
		want      []string
	}{
		{4, nil},
		{5, []string{`"msg"="node passes" "node"="a"`, `"msg"="node refused" "node"="b" "reason"=`}},
	} {
		var mu sync.Mutex
		var lines []string
		log := funcr.New(func(prefix, args string) {
			mu.Lock()
			lines = append(lines, args)
			mu.Unlock()
		}, funcr.Options{Verbosity: tc.verbosity})
		ctx := klog.NewContext(context.Background(), log)
		res := x.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
		if res.Error != "" || len(*res.NodeNames) != 1 {
			t.Fatalf("filter: %+v", res)
		}
		all := strings.Join(lines, "\n")
		for _, w := range tc.want {
			if !strings.Contains(all, w) {
				t.Errorf("verbosity %d: log lacks %s:\n%s", tc.verbosity, w, all)
			}
		}
		if tc.want == nil && len(lines) > 0 {
			t.Errorf("verbosity %d: logged %q; verdicts are verbosity 5", tc.verbosity, lines)
		}
	}
}
