package doccommands

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	topomachine "github.com/gputopo/gputopo/topology/machine"
)

// documents are the files whose commands are checked.
func documents(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md under %s: %v", root, err)
	}
	return append([]string{filepath.Join(root, "README.md")}, docs...)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// TestDocumentedCommandsWork checks every make, gputopo and kubectl gputopo
// command that README.md and docs/ quote. make targets (and the variables
// given to them) must exist in the Makefile. gputopo and kubectl gputopo
// commands run from binaries built here: each one's subcommands must
// resolve, its flags must exist and parse and it must not take more
// arguments than its usage line names; then it runs for real when that is
// quick and writes only into a scratch directory (version, machine show,
// machine import, simulate with its inputs present), else with --help
// appended. A simulate run without --policy gets --policy first-fit, the
// cheap baseline, so that it takes milliseconds while every documented flag
// is still parsed and validated as written (--suite only gets --help).
func TestDocumentedCommandsWork(t *testing.T) {
	root := repoRoot(t)
	var cmds []Command
	for _, doc := range documents(t, root) {
		cs, err := Extract(doc)
		if err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cs...)
	}
	if len(cmds) < 50 {
		t.Fatalf("found only %d documented commands; the extraction is broken", len(cmds))
	}
	targets, vars := makefile(t, filepath.Join(root, "Makefile"))
	r := newRunner(t, root)

	seen := map[string]bool{}
	for _, c := range cmds {
		rel, _ := filepath.Rel(root, c.File)
		c.File = rel
		if seen[c.Text] {
			continue
		}
		seen[c.Text] = true
		var err error
		if c.Words[0] == "make" {
			err = checkMake(c, targets, vars)
		} else {
			err = r.check(c)
		}
		if err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
	t.Logf("checked %d distinct commands (%d quotes): %d run for real, %d with --help", len(seen), len(cmds), r.real, r.helped)
}

// makefile returns the Makefile's explicit targets and the variables it
// reads.
func makefile(t *testing.T, path string) (map[string]bool, map[string]bool) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	targets, vars := map[string]bool{}, map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := targetRE.FindStringSubmatch(line); m != nil {
			for _, name := range strings.Fields(m[1]) {
				targets[name] = true
			}
		}
		for _, m := range varRefRE.FindAllStringSubmatch(line, -1) {
			vars[m[1]] = true
		}
	}
	return targets, vars
}

var (
	targetRE = regexp.MustCompile(`^([A-Za-z0-9_-][A-Za-z0-9_./ -]*?)\s*:([^=]|$)`)
	varRefRE = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
)

func checkMake(c Command, targets, vars map[string]bool) error {
	for _, w := range c.Words[1:] {
		switch {
		case strings.HasPrefix(w, "-"):
		case strings.Contains(w, "="):
			if name, _, _ := strings.Cut(w, "="); !vars[name] {
				return fmt.Errorf("the Makefile reads no variable %s", name)
			}
		case !targets[w]:
			return fmt.Errorf("the Makefile has no target %q", w)
		}
	}
	return nil
}

// build compiles gputopo and kubectl-gputopo into binDir.
func build(root string) (map[string]string, error) {
	bins := map[string]string{"gputopo": filepath.Join(binDir, "gputopo"), "kubectl-gputopo": filepath.Join(binDir, "kubectl-gputopo")}
	for name, pkg := range map[string]string{"gputopo": "./cmd/gputopo", "kubectl-gputopo": "./cmd/kubectl-gputopo"} {
		cmd := exec.Command("go", "build", "-o", bins[name], pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return bins, nil
}

// binDir holds the binaries the tests build; TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "doccommands-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// scratchDir is where commands run: every top-level entry of the
// repository linked in (so that topology/machine/testdata/... resolves as in the
// docs), and what they write stays there.
func scratchDir(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "_out" || e.Name() == ".git" {
			continue
		}
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// newRunner builds the binaries (once per test binary) and makes a scratch
// directory.
func newRunner(t *testing.T, root string) *runner {
	t.Helper()
	binsOnce.Do(func() { bins, binsErr = build(root) })
	if binsErr != nil {
		t.Fatal(binsErr)
	}
	return &runner{bins: bins, scratch: scratchDir(t, root), root: root, help: map[string]*helpInfo{}}
}

var (
	binsOnce sync.Once
	bins     map[string]string
	binsErr  error
)

type runner struct {
	bins          map[string]string
	scratch, root string
	help          map[string]*helpInfo
	real, helped  int
}

// helpInfo is what a command's --help says about it.
type helpInfo struct {
	path []string // the command path, "gputopo machine show"
	// slots is how many positional arguments the usage line names; group
	// is true when the command only holds subcommands.
	slots int
	group bool
	// flags maps every flag name (long and short) to whether it takes a
	// value.
	flags map[string]bool
}

// check checks one gputopo or kubectl gputopo command.
func (r *runner) check(c Command) error {
	bin, args := r.split(c)
	// "..." elides part of a command and [ ] marks what is optional: check
	// the rest, and the optional parts as given.
	elided := false
	var cleaned []string
	for _, a := range args {
		if a == "..." {
			elided = true
			continue
		}
		cleaned = append(cleaned, strings.TrimSuffix(strings.TrimPrefix(a, "["), "]"))
	}
	args = cleaned
	var lead []string // the words before the first flag
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			break
		}
		lead = append(lead, a)
	}
	h, err := r.helpOf(bin, lead)
	if err != nil {
		return err
	}
	name := filepath.Base(bin)
	want := append([]string{name}, lead...)
	if len(h.path) > len(want) || !slices.Equal(h.path, want[:len(h.path)]) {
		return fmt.Errorf("resolves to `%s`", strings.Join(h.path, " "))
	}
	positional := lead[len(h.path)-1:]
	// Flags, their values, and positional arguments after them.
	flagRef := false
	for i := len(lead); i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			positional = append(positional, a)
			continue
		}
		fname, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takes, ok := h.flags[fname]
		if !ok {
			return fmt.Errorf("`%s` has no flag %s", strings.Join(h.path, " "), a)
		}
		if takes && !hasValue {
			if i == len(args)-1 {
				// Prose naming the flag (`gputopo simulate --cluster`).
				flagRef = true
				args = args[:i]
				break
			}
			i++
		}
	}
	switch {
	case h.group && len(positional) > 0:
		return fmt.Errorf("`%s` has no subcommand %q", strings.Join(h.path, " "), positional[0])
	case len(positional) > h.slots:
		return fmt.Errorf("`%s` takes %d argument(s), the docs give %q", strings.Join(h.path, " "), h.slots, positional)
	}
	if run, ok := r.realRun(h, args); ok && !elided && !flagRef {
		r.real++
		if out, err := r.run(bin, run...); err != nil {
			return fmt.Errorf("ran `%s %s`: %v\n%s", name, strings.Join(run, " "), err, out)
		}
		return nil
	}
	r.helped++
	if out, err := r.run(bin, append(args, "--help")...); err != nil {
		return fmt.Errorf("`%s %s --help`: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// split maps the documented command to a binary and its arguments.
func (r *runner) split(c Command) (string, []string) {
	if c.Words[0] == "kubectl" {
		return r.bins["kubectl-gputopo"], c.Words[2:]
	}
	return r.bins["gputopo"], c.Words[1:]
}

var (
	usageRE = regexp.MustCompile(`(?m)^Usage:\n  (.*)$`)
	flagRE  = regexp.MustCompile(`(?m)^\s+(?:-([A-Za-z0-9]), )?--([A-Za-z0-9][A-Za-z0-9_-]*)(?: (\S+))?(?:\s|$)`)
)

// helpOf runs BIN LEAD... --help and reads the usage line and the flags.
func (r *runner) helpOf(bin string, lead []string) (*helpInfo, error) {
	key := bin + " " + strings.Join(lead, " ")
	if h, ok := r.help[key]; ok {
		return h, nil
	}
	out, err := r.run(bin, append(slices.Clone(lead), "--help")...)
	if err != nil {
		return nil, fmt.Errorf("`%s %s --help`: %v\n%s", filepath.Base(bin), strings.Join(lead, " "), err, out)
	}
	m := usageRE.FindStringSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("`%s %s --help` prints no usage line:\n%s", filepath.Base(bin), strings.Join(lead, " "), out)
	}
	h := &helpInfo{flags: map[string]bool{"help": false, "h": false}}
	for _, w := range strings.Fields(m[1]) {
		switch {
		case w == "[command]":
			h.group = true
		case w == "[flags]":
		case strings.HasPrefix(w, "[") || strings.ToUpper(w) == w:
			h.slots++
		default:
			h.path = append(h.path, w)
		}
	}
	for _, f := range flagRE.FindAllStringSubmatch(out, -1) {
		takes := f[3] != ""
		h.flags[f[2]] = takes
		if f[1] != "" {
			h.flags[f[1]] = takes
		}
	}
	r.help[key] = h
	return h, nil
}

// realRun says whether the command runs for real, and with which
// arguments: placeholders and missing configuration files replaced with
// real ones in the scratch directory.
func (r *runner) realRun(h *helpInfo, args []string) ([]string, bool) {
	path := strings.Join(h.path, " ")
	args = slices.Clone(args)
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(r.scratch, p))
		return err == nil
	}
	value := func(flag string) (int, bool) {
		for i, a := range args {
			if a == flag && i+1 < len(args) {
				return i + 1, true
			}
		}
		return 0, false
	}
	switch path {
	case "gputopo version":
		return args, true
	case "gputopo machine show":
		m := args[len(args)-1]
		if _, err := topomachine.FixtureByName(m); err == nil || exists(m) {
			return args, true
		}
	case "gputopo machine import":
		if _, ok := value("--smi"); !ok {
			if _, ok := value("--nccl-topo"); !ok {
				return nil, false // prose naming the command
			}
		}
		for _, f := range []string{"--smi", "--smi-list", "--smi-pci", "--nccl-topo"} {
			if i, ok := value(f); ok && !exists(args[i]) {
				return nil, false
			}
		}
		return args, true
	case "gputopo simulate":
		// The suites and families run long: checked with --help.
		if slices.Contains(args, "--suite") || slices.Contains(args, "--family") || slices.Contains(args, "--sliced-suite") || slices.Contains(args, "--gang-suite") {
			return nil, false
		}
		if i, ok := value("--cluster"); ok {
			for _, entry := range strings.Split(args[i], ",") {
				machine, _, _ := strings.Cut(entry, "=")
				if _, err := topomachine.FixtureByName(machine); err != nil && !exists(machine) {
					return nil, false
				}
			}
		}
		if i, ok := value("--trace"); ok && !strings.Contains(args[i], ":") && !exists(args[i]) {
			return nil, false
		}
		// Stand-ins for the reader's own configuration files.
		for flag, src := range map[string]string{"--extender-config": "extender/testdata/defaults.json", "--webhook-config": "webhook/testdata/defaults.json"} {
			if i, ok := value(flag); ok && !exists(args[i]) {
				data, err := os.ReadFile(filepath.Join(r.root, src))
				if err != nil {
					return nil, false
				}
				name := filepath.Join(r.scratch, "standin-"+strings.TrimPrefix(flag, "--")+".json")
				if err := os.WriteFile(name, data, 0o644); err != nil {
					return nil, false
				}
				args[i] = name
			}
		}
		if !slices.Contains(args, "--policy") && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--policy=") }) {
			args = append(args, "--policy", "first-fit")
		}
		return args, true
	}
	return nil, false
}

// run runs bin in the scratch directory and returns its output; a non-zero
// exit is an error.
func (r *runner) run(bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = r.scratch
	cmd.Env = append(os.Environ(), "KUBECONFIG="+filepath.Join(r.scratch, "no-kubeconfig"), "NO_COLOR=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return out.String(), fmt.Errorf("did not finish in 30s")
	}
	return out.String(), err
}

// The check finds what breaks: a subcommand or a flag that does not exist,
// too many arguments, a make target the Makefile lacks, and a command that
// fails when it runs.
func TestCheckRefusesBrokenCommands(t *testing.T) {
	root := repoRoot(t)
	targets, vars := makefile(t, filepath.Join(root, "Makefile"))
	r := newRunner(t, root)
	for line, want := range map[string]string{
		"gputopo machine dump": "\"dump\"", // the binary's refusal, or the usage line's

		"gputopo simulate --no-such-flag":           "has no flag --no-such-flag",
		"gputopo version now":                       "takes 0 argument(s)",
		"kubectl gputopo nodez":                     "unknown command",
		"kubectl gputopo explain -n NS POD OTHER":   "takes 1 argument(s)",
		"gputopo simulate --trace bundled:nope":     "unknown bundled trace",
		"gputopo machine show no-such-machine.yaml": "",
		"make no-such-target":                       "no target \"no-such-target\"",
		"make demo NO_SUCH_VAR=1":                   "reads no variable NO_SUCH_VAR",
	} {
		words, err := splitWords(line)
		if err != nil {
			t.Fatal(err)
		}
		c := Command{File: "test", Line: 1, Text: line, Words: words}
		if words[0] == "make" {
			err = checkMake(c, targets, vars)
		} else {
			err = r.check(c)
		}
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v; want it checked with --help (no such file to run it with)", line, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: %v; want an error with %q", line, err, want)
		}
	}
	for _, line := range []string{"gputopo simulate --trace bundled:fragment", "gputopo machine show dgx1-v100", "kubectl gputopo explain -n NS --job NAME", "gputopo simulate --cluster", "make demo DEMO_FLAGS=--keep"} {
		words, _ := splitWords(line)
		c := Command{File: "test", Line: 1, Text: line, Words: words}
		var err error
		if words[0] == "make" {
			err = checkMake(c, targets, vars)
		} else {
			err = r.check(c)
		}
		if err != nil {
			t.Errorf("%s: %v", line, err)
		}
	}
}
