package layering

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The core's surface (docs/design.md, "The core's calls"): nothing
// outside package placement holds the mutable ledger, the ledger's lock
// stripes are its own, and the plugin's extension points each make at
// most two calls into the core.

// ledgerLeaks are the places in src (one file, path rel) that hand out or
// take the mutable ledger outside the core: a call X.Ledger() outside
// package placement, and in placement an exported function or method
// whose results include *ledger.Ledger.
func ledgerLeaks(rel string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, 0)
	if err != nil {
		return nil, err
	}
	dir := filepath.ToSlash(filepath.Dir(rel))
	var out []string
	if dir == "placement" {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() || fd.Type.Results == nil {
				continue
			}
			for _, r := range fd.Type.Results.List {
				if star, ok := r.Type.(*ast.StarExpr); ok {
					if sel, ok := star.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "Ledger" {
						out = append(out, fmt.Sprintf("%s: %s returns the mutable *ledger.Ledger; hand out placement.Feed or placement.Report", fset.Position(fd.Pos()), fd.Name.Name))
					}
				}
			}
		}
		return out, nil
	}
	if dir == "placement/ledger" {
		return nil, nil
	}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) > 0 {
			return true
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "Ledger" {
			out = append(out, fmt.Sprintf("%s: .Ledger() outside package placement; feed the core through Feed() and read it through Report()", fset.Position(call.Pos())))
		}
		return true
	})
	return out, nil
}

// stripeLeaks are the ledger's exported names in src that speak of its
// lock stripes: an exported identifier with "stripe" in its name, or an
// exported function or method with a parameter so named.
func stripeLeaks(rel string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, rel, src, 0)
	if err != nil {
		return nil, err
	}
	var out []string
	stripy := func(name string) bool { return strings.Contains(strings.ToLower(name), "stripe") }
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if stripy(d.Name.Name) {
				out = append(out, fmt.Sprintf("%s: exported %s names a lock stripe", fset.Position(d.Pos()), d.Name.Name))
			}
			for _, p := range d.Type.Params.List {
				for _, n := range p.Names {
					if stripy(n.Name) {
						out = append(out, fmt.Sprintf("%s: exported %s takes a lock stripe (%s)", fset.Position(d.Pos()), d.Name.Name, n.Name))
					}
				}
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				var names []*ast.Ident
				switch s := s.(type) {
				case *ast.ValueSpec:
					names = s.Names
				case *ast.TypeSpec:
					names = []*ast.Ident{s.Name}
				}
				for _, n := range names {
					if n.IsExported() && stripy(n.Name) {
						out = append(out, fmt.Sprintf("%s: exported %s names a lock stripe", fset.Position(n.Pos()), n.Name))
					}
				}
			}
		}
	}
	return out, nil
}

// goFiles are the module's Go files (tests included), module-relative,
// outside build output and vendored tools.
func goFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("../..", path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_") || rel == "bin" || rel == "hack/tools") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestNoMutableLedgerOutsideTheCore: no .Ledger() call outside package
// placement, no exported call of placement that returns the ledger, and
// no exported name of the ledger that speaks of its lock stripes.
func TestNoMutableLedgerOutsideTheCore(t *testing.T) {
	files := goFiles(t)
	if len(files) < 100 {
		t.Fatalf("found %d Go files; the module has more", len(files))
	}
	for _, rel := range files {
		src, err := os.ReadFile(filepath.Join("../..", rel))
		if err != nil {
			t.Fatal(err)
		}
		leaks, err := ledgerLeaks(rel, src)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.ToSlash(filepath.Dir(rel)) == "placement/ledger" && !strings.HasSuffix(rel, "_test.go") {
			more, err := stripeLeaks(rel, src)
			if err != nil {
				t.Fatal(err)
			}
			leaks = append(leaks, more...)
		}
		for _, l := range leaks {
			t.Error(l)
		}
	}
}

// TestSurfaceRulesCatchALeak feeds the rules sources that break them.
func TestSurfaceRulesCatchALeak(t *testing.T) {
	for _, tc := range []struct {
		rel, src string
		check    func(string, []byte) ([]string, error)
		want     int
	}{
		{"extender/x_test.go", "package extender\nfunc f() { x.core.Ledger().UpsertPod(nil) }", ledgerLeaks, 1},
		{"kubectlplugin/x.go", "package kubectlplugin\nfunc f() { x.Feed().UpsertPod(nil); x.Report().Counts() }", ledgerLeaks, 0},
		{"placement/core.go", "package placement\nfunc (x *Core) Ledger() *ledger.Ledger { return x.ledger }", ledgerLeaks, 1},
		{"placement/core.go", "package placement\nfunc (x *Core) ledgerOf() *ledger.Ledger { return x.ledger }", ledgerLeaks, 0},
		{"placement/ledger/lock.go", "package ledger\nfunc StripeOf(key string) int { return 0 }", stripeLeaks, 1},
		{"placement/ledger/node.go", "package ledger\nfunc (l *Ledger) ReadNode(stripe int, fn func(View)) {}", stripeLeaks, 1},
		{"placement/ledger/lock.go", "package ledger\nconst ReadStripes = 8", stripeLeaks, 1},
		{"placement/ledger/lock.go", "package ledger\nfunc stripeOf(key string) int { return 0 }\nfunc (l *Ledger) ReadNode(node string, fn func(View)) {}", stripeLeaks, 0},
	} {
		got, err := tc.check(tc.rel, []byte(tc.src))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != tc.want {
			t.Errorf("%s %q: %d findings %q, want %d", tc.rel, tc.src, len(got), got, tc.want)
		}
	}
}

// coreServices are the core's types whose methods are calls into the
// core; the accessors that only hand out one of them do no work and are
// not counted.
var (
	coreServices  = map[string]bool{"Core": true, "Cycle": true, "Preemption": true, "Upkeep": true}
	coreAccessors = map[string]bool{"Preemption": true, "Upkeep": true, "Feed": true, "Report": true}
)

// extensionPoints are the plugin's methods whose core calls are counted,
// and the most each may make.
var extensionPoints = map[string]int{"PreFilter": 2, "Filter": 2, "PreScore": 2, "Score": 2}

// coreCalls counts, per method of the plugin's type named in
// extensionPoints, the calls in its body to methods of the core's
// services (closures inside the body included).
func coreCalls(fset *token.FileSet, files []*ast.File, info *types.Info) map[string]int {
	out := map[string]int{}
	for _, f := range files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || fd.Body == nil {
				continue
			}
			if _, ok := extensionPoints[fd.Name.Name]; !ok {
				continue
			}
			n := 0
			ast.Inspect(fd.Body, func(node ast.Node) bool {
				call, ok := node.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				fn, ok := info.Uses[sel.Sel].(*types.Func)
				if !ok || fn.Pkg() == nil || fn.Pkg().Path() != module+"/placement" {
					return true
				}
				recv := fn.Signature().Recv()
				if recv == nil {
					return true
				}
				t := recv.Type()
				if p, ok := t.(*types.Pointer); ok {
					t = p.Elem()
				}
				named, ok := t.(*types.Named)
				if ok && coreServices[named.Obj().Name()] && !coreAccessors[fn.Name()] {
					n++
				}
				return true
			})
			out[fd.Name.Name] += n
		}
	}
	return out
}

// exportImporter type-checks against the compiled export data of pkg's
// dependencies, as go list -export reports them.
func exportImporter(t *testing.T, fset *token.FileSet, pkg string) types.Importer {
	t.Helper()
	out := goList(t, "-export", "-deps", "-f", "{{.ImportPath}} {{.Export}}", pkg)
	exports := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if path, file, ok := strings.Cut(line, " "); ok && file != "" {
			exports[path] = file
		}
	}
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
}

// checkPackage parses and type-checks the given sources as one package.
func checkPackage(t *testing.T, fset *token.FileSet, imp types.Importer, path string, srcs map[string][]byte) ([]*ast.File, *types.Info) {
	t.Helper()
	names := make([]string, 0, len(srcs))
	for name := range srcs {
		names = append(names, name)
	}
	sort.Strings(names)
	var files []*ast.File
	for _, name := range names {
		f, err := parser.ParseFile(fset, name, srcs[name], 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: imp}
	if _, err := conf.Check(path, fset, files, info); err != nil {
		t.Fatalf("type-check %s: %v", path, err)
	}
	return files, info
}

// TestPluginExtensionPointsMakeAtMostTwoCoreCalls: the scheduler plugin's
// PreFilter, Filter, PreScore and Score each call the core at most
// twice; the plugin only translates the core's answers into framework
// statuses.
func TestPluginExtensionPointsMakeAtMostTwoCoreCalls(t *testing.T) {
	fset := token.NewFileSet()
	imp := exportImporter(t, fset, module+"/schedplugin")
	matches, err := filepath.Glob("../../schedplugin/*.go")
	if err != nil {
		t.Fatal(err)
	}
	srcs := map[string][]byte{}
	for _, m := range matches {
		if strings.HasSuffix(m, "_test.go") {
			continue
		}
		if srcs[m], err = os.ReadFile(m); err != nil {
			t.Fatal(err)
		}
	}
	files, info := checkPackage(t, fset, imp, module+"/schedplugin", srcs)
	got := coreCalls(fset, files, info)
	t.Logf("core calls per extension point: %v", got)
	for ep, most := range extensionPoints {
		if got[ep] > most {
			t.Errorf("the plugin's %s makes %d core calls, want at most %d", ep, got[ep], most)
		}
	}
	if got["PreFilter"] == 0 || got["Filter"] == 0 || got["PreScore"] == 0 {
		t.Errorf("core calls %v: PreFilter, Filter and PreScore each call the core; the count is broken", got)
	}

	// The count catches a PreFilter that asks the core piecemeal.
	bad := []byte(`package bad
import (
	"context"
	"github.com/gputopo/gputopo/placement"
)
type P struct{ x *placement.Core }
func (p *P) PreFilter(ctx context.Context, in placement.PreFilterInput) bool {
	if p.x.NotReady() != "" {
		return false
	}
	plan := p.x.PreFilter(ctx, in)
	_ = p.x.Preemption().MayHelp(0)
	return plan.Skip
}
`)
	files, info = checkPackage(t, fset, imp, "bad", map[string][]byte{"bad.go": bad})
	if n := coreCalls(fset, files, info)["PreFilter"]; n != 3 {
		t.Errorf("a PreFilter with three core calls counted %d", n)
	}
}
