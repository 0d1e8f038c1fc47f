package layering

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/gputopo/gputopo"

// layer is one tier of the layering; a package may import packages of
// lower tiers and, within its tier, only its own subtree.
type layer struct {
	name string
	// prefixes are the packages of the tier (a prefix covers its subtree).
	prefixes []string
}

// layers, lowest first: cmd → front ends → core → topology → api
// (docs/design.md, "Layout"). internal/picture draws topologies for two
// front ends; internal/localcluster, demo and cmd compose the front ends
// into processes.
var layers = []layer{
	{"api", []string{"api/v1alpha1", "api/config/v1alpha1"}},
	{"topology", []string{"topology"}},
	{"core", []string{"placement", "internal/picture"}},
	{"front end", []string{"extender", "schedplugin", "kubectlplugin", "simulator", "webhook", "nodeagent"}},
	{"composition", []string{"internal/localcluster", "demo", "cmd"}},
}

// own are the imports allowed inside one tier, beyond a package's own
// subtree: package → the packages it may import.
var own = map[string][]string{
	// The model, the allocator over it and machine files that build it.
	"topology/allocator": {"topology"},
	"topology/machine":   {"topology"},
	// The metrics the front ends export observe the core.
	"placement/metrics": {"placement", "placement/ledger"},
	"placement":         {"placement/ledger"},
	// The core's runtime in a cluster starts the core and feeds its ledger.
	"placement/cluster": {"placement", "placement/ledger"},
	// The extender's configuration validates the requirement type.
	"api/config/v1alpha1": {"api/v1alpha1"},
	// The composition tier wires front ends and the local cluster.
	"demo":                {"internal/localcluster"},
	"cmd/gputopo":         {"cmd/gputopo/app"},
	"cmd/gputopo/app":     {"demo"},
	"cmd/kubectl-gputopo": {},
}

// testOnly may be imported only by tests (files *_test.go and test/).
var testOnly = []string{
	module + "/internal/fakeapi",
	module + "/test/",
	"k8s.io/client-go/kubernetes/fake",
	"sigs.k8s.io/controller-runtime/pkg/client/fake",
}

type pkg struct {
	ImportPath string
	Imports    []string
}

// goList runs go list with args in the module's root.
func goList(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// packages lists the module's packages with their non-test imports.
func packages(t *testing.T) []pkg {
	t.Helper()
	out := goList(t, "-json=ImportPath,Imports", module+"/...")
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// tierOf is the tier of a module-relative package path and the prefix that
// placed it there; -1 outside the layering (test/, hack/).
func tierOf(rel string) (int, string) {
	for i, l := range layers {
		for _, p := range l.prefixes {
			if rel == p || strings.HasPrefix(rel, p+"/") {
				return i, p
			}
		}
	}
	return -1, ""
}

// violations are the imports of pkgs the layering forbids, one line each.
func violations(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		from, fromRoot := tierOf(rel)
		if from < 0 {
			continue
		}
		for _, imp := range p.Imports {
			for _, bad := range testOnly {
				if imp == strings.TrimSuffix(bad, "/") || strings.HasSuffix(bad, "/") && strings.HasPrefix(imp, bad) {
					out = append(out, fmt.Sprintf("%s imports %s, which only tests may import", rel, imp))
				}
			}
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			irel := strings.TrimPrefix(imp, module+"/")
			to, toRoot := tierOf(irel)
			if irel == "placement/ledger" && from > to {
				out = append(out, fmt.Sprintf("%s imports placement/ledger: only the core reaches the ledger; feed it through placement.Feed and read through placement", rel))
				continue
			}
			switch {
			case to < 0:
				out = append(out, fmt.Sprintf("%s imports %s, which is outside the layering", rel, irel))
			case to < from:
			case to == from && (toRoot == fromRoot && strings.HasPrefix(irel, rel+"/") || allowed(rel, irel)):
			case to == from && toRoot == fromRoot && fromRoot == "nodeagent":
				// The node agent's own subpackages (simulated NVML, the
				// NVML level map) serve it and each other.
			default:
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): a %s may import only lower layers (%s)",
					rel, layers[from].name, irel, layers[to].name, layers[from].name, lower(from)))
			}
		}
	}
	sort.Strings(out)
	return out
}

func allowed(from, to string) bool {
	for _, a := range own[from] {
		if a == to {
			return true
		}
	}
	return false
}

func lower(tier int) string {
	var names []string
	for _, l := range layers[:tier] {
		names = append(names, l.name)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// TestImportsFollowTheLayers keeps the layering docs/design.md states: cmd
// → front ends → core → topology → api, no front end importing another,
// and test doubles out of every shipped package.
func TestImportsFollowTheLayers(t *testing.T) {
	pkgs := packages(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; the module has more", len(pkgs))
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestLayeringCatchesAForbiddenImport feeds the rules imports that break
// them, so that a rule that cannot fail is noticed.
func TestLayeringCatchesAForbiddenImport(t *testing.T) {
	for _, tc := range []struct {
		from, imp string
		want      string
	}{
		{"placement", module + "/extender", "placement (core) imports extender (front end)"},
		{"topology", module + "/placement/ledger", "topology (topology) imports placement/ledger (core)"},
		{"simulator", module + "/webhook", "simulator (front end) imports webhook (front end)"},
		{"kubectlplugin", module + "/internal/fakeapi", "only tests may import"},
		{"simulator", "k8s.io/client-go/kubernetes/fake", "only tests may import"},
		{"api/v1alpha1", module + "/topology", "api/v1alpha1 (api) imports topology (topology)"},
		{"kubectlplugin", module + "/placement/ledger", "only the core reaches the ledger"},
		{"cmd/gputopo/app", module + "/placement/ledger", "only the core reaches the ledger"},
	} {
		got := violations([]pkg{{ImportPath: module + "/" + tc.from, Imports: []string{tc.imp}}})
		if len(got) == 0 || !strings.Contains(got[0], tc.want) {
			t.Errorf("%s importing %s: violations %q, want one saying %q", tc.from, tc.imp, got, tc.want)
		}
	}
	if got := violations([]pkg{{ImportPath: module + "/extender", Imports: []string{module + "/placement", module + "/topology"}}}); len(got) > 0 {
		t.Errorf("a front end importing the core and the model: %q, want none", got)
	}
}

// pure are the packages that decide and hold state only: their whole
// dependency tree (not just their own imports) is free of the cluster
// runtime's libraries (docs/design.md, "Layout").
var pure = []string{"placement", "placement/ledger"}

// runtimeOnly are the libraries a pure package may not depend on: API
// clients, REST, leader election, Event recording, controller-runtime and
// the Prometheus client. A prefix ending in "/" covers its subtree.
var runtimeOnly = []string{
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/rest",
	"k8s.io/client-go/tools/leaderelection",
	"k8s.io/client-go/tools/record",
	"sigs.k8s.io/controller-runtime/",
	"github.com/prometheus/client_golang/",
}

// impureDeps are the dependencies of pkg (its deps, as go list -deps
// lists them) that runtimeOnly forbids, one line each.
func impureDeps(pkg string, deps []string) []string {
	var out []string
	for _, d := range deps {
		for _, bad := range runtimeOnly {
			if d == strings.TrimSuffix(bad, "/") || strings.HasSuffix(bad, "/") && strings.HasPrefix(d, bad) ||
				!strings.HasSuffix(bad, "/") && strings.HasPrefix(d, bad+"/") {
				out = append(out, fmt.Sprintf("%s depends on %s: the core decides; the cluster runtime (placement/cluster) talks to the cluster", pkg, d))
			}
		}
	}
	return out
}

// TestTheCoreDependsOnNoClusterRuntime keeps placement and
// placement/ledger free of the runtime's libraries: go list -deps shows
// none of them.
func TestTheCoreDependsOnNoClusterRuntime(t *testing.T) {
	for _, p := range pure {
		deps := strings.Fields(string(goList(t, "-deps", module+"/"+p)))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed %d packages; it has more", p, len(deps))
		}
		for _, v := range impureDeps(p, deps) {
			t.Error(v)
		}
	}
	for _, tc := range []struct {
		dep  string
		want bool
	}{
		{"k8s.io/client-go/rest", true},
		{"k8s.io/client-go/kubernetes/typed/core/v1", true},
		{"k8s.io/client-go/tools/record", true},
		{"sigs.k8s.io/controller-runtime/pkg/cache", true},
		{"github.com/prometheus/client_golang/prometheus", true},
		{"k8s.io/client-go/restmapper", false},
		{"k8s.io/api/core/v1", false},
		{"github.com/prometheus/common/model", false},
	} {
		if got := len(impureDeps("placement", []string{tc.dep})) > 0; got != tc.want {
			t.Errorf("a dependency on %s refused: %v, want %v", tc.dep, got, tc.want)
		}
	}
}
