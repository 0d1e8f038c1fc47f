package app

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand(context.Background())
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestVersionPrintsTheStampedVersion(t *testing.T) {
	out, err := run(t, "version")
	if err != nil || strings.TrimSpace(out) != Version {
		t.Fatalf("version: out %q err %v, want %q", out, err, Version)
	}
}

// Each component validates the options as parsed from its flags, before it
// touches the cluster: a bad flag is reported by name.
func TestComponentsValidateParsedFlags(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"webhook port out of range": {args: []string{"webhook", "--port", "0"}, want: "--port 0: must be between 1 and 65535"},
		"nodeagent without a node":  {args: []string{"nodeagent", "--node-name", ""}, want: "node-name: Required value"},
		"nodeagent unknown fixture": {args: []string{"nodeagent", "--node-name", "n1", "--simulate", "dgx-9000"}, want: "simulate: Invalid value: \"dgx-9000\""},
		"extender bad port":         {args: []string{"extender", "--port", "-1"}, want: "port"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: err = %v, want it to contain %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestEverySubcommandIsRegistered(t *testing.T) {
	cmd := NewCommand(context.Background())
	for _, name := range []string{"webhook", "extender", "nodeagent", "simulate", "machine", "demo", "version"} {
		if c, _, err := cmd.Find([]string{name}); err != nil || c.Name() != name {
			t.Errorf("subcommand %s: %v", name, err)
		}
	}
}

// execute runs Execute as main does and returns the exit code, stdout and
// stderr.
func execute(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := Execute(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// gputopo --help lists every command with its one line, grouped, and no
// klog flags: only the components log, and their help has them.
func TestTopLevelHelpListsCommandsWithoutLogFlags(t *testing.T) {
	code, out, _ := execute(t, "--help")
	if code != ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	for _, c := range NewCommand(context.Background()).Commands() {
		if c.Short == "" {
			t.Errorf("command %s has no description", c.Name())
		}
		if !strings.Contains(out, c.Short) {
			t.Errorf("--help does not list %s with its description %q:\n%s", c.Name(), c.Short, out)
		}
	}
	for _, want := range []string{"Components (run in the cluster", "Tools:"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q:\n%s", want, out)
		}
	}
	logFlag := regexp.MustCompile(`(?m)^\s+(-v, --v|--vmodule|--log_dir)\b`)
	if logFlag.MatchString(out) {
		t.Errorf("--help shows klog's flags:\n%s", out)
	}
	for _, sub := range [][]string{{"simulate"}, {"machine", "import"}, {"demo"}, {"version"}} {
		_, out, _ := execute(t, append(sub, "--help")...)
		if logFlag.MatchString(out) {
			t.Errorf("%v --help shows klog's flags:\n%s", sub, out)
		}
	}
}

// The components have a description and take klog's flags, listed apart
// from their own; nodeagent dump inherits them.
func TestComponentsDescribeThemselvesAndTakeLogFlags(t *testing.T) {
	for _, c := range [][]string{{"webhook"}, {"extender"}, {"nodeagent"}, {"nodeagent", "dump"}} {
		code, out, _ := execute(t, append(c, "--help")...)
		if code != ExitOK {
			t.Fatalf("%v --help: exit %d", c, code)
		}
		own, logs, ok := strings.Cut(out, "Logging flags (klog):")
		if !ok || !strings.Contains(logs, "-v, --v Level") || !strings.Contains(logs, "--vmodule") {
			t.Errorf("%v --help has no logging flags section:\n%s", c, out)
		}
		if strings.Contains(own, "--vmodule") {
			t.Errorf("%v --help lists klog's flags among its own", c)
		}
		cmd, _, err := NewCommand(context.Background()).Find(c)
		if err != nil {
			t.Fatal(err)
		}
		if len(c) == 1 && (cmd.Long == "" || !strings.HasPrefix(out, strings.SplitN(cmd.Long, "\n", 2)[0])) {
			t.Errorf("%v --help does not start with its description:\n%s", c, out)
		}
		if err := cmd.ParseFlags([]string{"--v=3", "--vmodule=ledger=5"}); err != nil {
			t.Errorf("%v: klog flags do not parse: %v", c, err)
		}
	}
}

// A wrong command line is one line on stderr and exit code 2; a failed
// command exit code 1; neither is a klog line.
func TestErrorsAreOneLineWithExitCodes(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"machine", "dump"}, ExitUsage, `gputopo: unknown command "dump" for "gputopo machine"; its commands: import, show`},
		{[]string{"machine", "dump", "--help"}, ExitUsage, `unknown command "dump" for "gputopo machine"`},
		{[]string{"bogus"}, ExitUsage, `gputopo: unknown command "bogus" for "gputopo"`},
		{[]string{"simulat"}, ExitUsage, `(did you mean simulate?)`},
		{[]string{"nodeagent", "dmp"}, ExitUsage, `unknown command "dmp" for "gputopo nodeagent"; its commands: dump`},
		{[]string{"version", "extra"}, ExitUsage, `gputopo: unknown command "extra" for "gputopo version"`},
		{[]string{"simulate", "--no-such-flag"}, ExitUsage, "gputopo: unknown flag: --no-such-flag (see 'gputopo simulate --help')"},
		{[]string{"simulate", "--seeds", "x"}, ExitUsage, `invalid argument "x" for "--seeds"`},
		{[]string{"machine", "show"}, ExitUsage, "accepts 1 arg(s), received 0"},
		{[]string{"webhook", "--port", "0"}, ExitFailed, "gputopo: --port 0: must be between 1 and 65535"},
		{[]string{"simulate", "--trace", "bundled:nope"}, ExitFailed, "gputopo: trace \"bundled:nope\": unknown bundled trace"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := execute(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errOut, tc.code, tc.want)
			}
			if strings.Count(errOut, "\n") != 1 || !strings.HasPrefix(errOut, "gputopo: ") {
				t.Errorf("stderr is not one gputopo: line: %q", errOut)
			}
			if out != "" {
				t.Errorf("stdout %q; want nothing", out)
			}
		})
	}
	// A command that only holds subcommands prints its help.
	if code, out, _ := execute(t, "machine"); code != ExitOK || !strings.Contains(out, "Available Commands") {
		t.Errorf("machine: exit %d\n%s", code, out)
	}
}

// --seeds without --trace replays the default trace's generator: seed 1
// is bundled:mixed itself.
func TestSimulateSeedsWithoutTrace(t *testing.T) {
	out, err := run(t, "simulate", "--seeds", "2", "--policy", "first-fit")
	if err != nil {
		t.Fatalf("simulate --seeds 2: %v\n%s", err, out)
	}
	if !strings.Contains(out, "traces gen:mixed:seed=1 .. gen:mixed:seed=2 (2 seeds)") {
		t.Errorf("simulate --seeds 2 does not replay gen:mixed seeds 1 and 2:\n%s", out)
	}
	// A bundled trace named with --seeds is still refused: it is one file.
	if _, err := run(t, "simulate", "--trace", "bundled:mixed", "--seeds", "2"); err == nil || !strings.Contains(err.Error(), "needs a generated trace") {
		t.Errorf("--trace bundled:mixed --seeds 2: %v", err)
	}
}
