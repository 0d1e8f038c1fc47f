package app

import (
	"bytes"
	"context"
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
	for _, name := range []string{"webhook", "extender", "nodeagent", "demo", "version"} {
		if c, _, err := cmd.Find([]string{name}); err != nil || c.Name() != name {
			t.Errorf("subcommand %s: %v", name, err)
		}
	}
}
