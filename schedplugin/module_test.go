package schedplugin

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// requirements reads the module paths and versions a go.mod requires.
func requirements(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	inBlock := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "require (":
			inBlock = true
			continue
		case inBlock && line == ")":
			inBlock = false
			continue
		case strings.HasPrefix(line, "require "):
			line = strings.TrimPrefix(line, "require ")
		case !inBlock:
			continue
		}
		if f := strings.Fields(line); len(f) >= 2 {
			out[f[0]] = f[1]
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The main module must not depend on k8s.io/kubernetes: only the
// gputopo-scheduler build (its own module) does, and it builds the plugin
// against the same kube-scheduler framework the main module compiles it
// with.
func TestMainModuleDoesNotRequireKubernetes(t *testing.T) {
	main := requirements(t, filepath.Join("..", "go.mod"))
	if v, ok := main["k8s.io/kubernetes"]; ok {
		t.Errorf("go.mod requires k8s.io/kubernetes %s; only cmd/gputopo-scheduler/go.mod may", v)
	}
	sched := requirements(t, filepath.Join("..", "cmd", "gputopo-scheduler", "go.mod"))
	if _, ok := sched["k8s.io/kubernetes"]; !ok {
		t.Errorf("cmd/gputopo-scheduler/go.mod does not require k8s.io/kubernetes")
	}
	for _, m := range []string{"k8s.io/kube-scheduler", "k8s.io/api", "k8s.io/client-go"} {
		if main[m] != "" && sched[m] != "" && main[m] != sched[m] {
			t.Errorf("%s: main module %s, gputopo-scheduler %s; keep them equal (go get in both)", m, main[m], sched[m])
		}
	}
}
