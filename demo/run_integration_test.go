//go:build integration

package demo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// `make demo` must work from a fresh clone: this runs the same Run on the
// default cluster and workloads and checks that every workload was placed,
// the table and the picture came out, and gputopo never did worse than
// count-only on all-NVLink sets.
// It runs in both modes (`gputopo demo` and `gputopo demo --mode plugin`).
func TestDemoPlacesEveryWorkloadAndBeatsCountOnly(t *testing.T) {
	for _, mode := range []string{ModeExtender, ModePlugin} {
		t.Run(mode, func(t *testing.T) { testDemo(t, mode) })
	}
}

func testDemo(t *testing.T, mode string) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var out bytes.Buffer
	dir := t.TempDir()
	if err := Run(ctx, Options{OutDir: dir, Out: &out, Mode: mode}); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log(text)
	for _, w := range DefaultWorkloads {
		if n := strings.Count(text, "\n"+w.Name+"-"); n != w.Pods {
			t.Errorf("table has %d rows for %s, want %d", n, w.Name, w.Pods)
		}
	}
	// llm-finetune, a model-parallel Job of 3 pods, is one group: its
	// rows name the group and one domain (columns GROUP and DOMAIN after
	// POD and INTENT).
	domains := map[string]bool{}
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[0], "llm-finetune-") {
			if f[2] != demoNamespace+"/llm-finetune" {
				t.Errorf("row %q: group %q, want %s/llm-finetune", l, f[2], demoNamespace)
			}
			domains[f[3]] = true
		}
	}
	if len(domains) != 1 || domains["-"] {
		t.Errorf("llm-finetune's pods are in domains %v; want one", domains)
	}
	m := regexp.MustCompile(`all-NVLink sets: gputopo (\d+), count-only (\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no summary line in output")
	}
	got, _ := strconv.Atoi(m[1])
	base, _ := strconv.Atoi(m[2])
	if got < base {
		t.Errorf("gputopo placed %d multi-GPU pods on all-NVLink sets, count-only %d", got, base)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "placement.svg"))
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) {
		t.Errorf("placement.svg missing or not SVG: %v", err)
	}
}
