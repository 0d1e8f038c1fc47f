package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Version is stamped at build time with
// -ldflags "-X github.com/gputopo/gputopo/cmd/gputopo/app.Version=v0.1.0".
var Version = "v0.0.0-dev"

// Command groups of `gputopo --help`.
const (
	groupComponents = "components"
	groupTools      = "tools"
)

// Exit codes of Execute.
const (
	ExitOK = 0
	// ExitFailed: the command ran and failed.
	ExitFailed = 1
	// ExitUsage: the command line is wrong (unknown command or flag, bad
	// flag value, wrong number of arguments); nothing ran.
	ExitUsage = 2
)

// NewCommand returns the root command. ctx is cancelled on SIGINT/SIGTERM.
func NewCommand(ctx context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:   "gputopo",
		Short: "GPU-topology-aware scheduling for Kubernetes",
		Long: `gputopo places GPU pods on the node and the exact GPUs whose interconnect fits
the workload. This one binary is each of its components, as the Helm chart
runs them, and the tools around them: the placement simulator, machine
descriptions from your own servers, and a demo on a local cluster.

The components log through klog; their logging flags (-v, --vmodule, ...)
are listed under each component's --help. See README.md and docs/.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetContext(ctx)
	root.AddGroup(
		&cobra.Group{ID: groupComponents, Title: "Components (run in the cluster; docs/install.md):"},
		&cobra.Group{ID: groupTools, Title: "Tools:"},
	)
	// controller-runtime logs through klog like the rest of the binary.
	ctrllog.SetLogger(klog.NewKlogr())
	root.AddCommand(newVersionCommand())
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	for _, c := range root.Commands() {
		if c.GroupID == "" && c.Name() != "help" && c.Name() != "completion" {
			c.GroupID = groupTools
		}
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{cmd: c, err: err}
	})
	strictArgs(root)
	return root
}

// subcommands are registered by the files of this package, one per
// component.
var subcommands []func() *cobra.Command

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), Version)
			return err
		},
	}
}

// addLogFlags gives a component that logs klog's flags (-v, --vmodule,
// ...), for it and its subcommands, in a help section of their own:
// only the components log, so the other commands do not show them.
func addLogFlags(cmd *cobra.Command) {
	goflags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(goflags)
	logs := pflag.NewFlagSet("logging", pflag.ContinueOnError)
	logs.AddGoFlagSet(goflags)
	usages := strings.TrimRight(logs.FlagUsages(), "\n ")
	logs.VisitAll(func(f *pflag.Flag) { f.Hidden = true })
	cmd.PersistentFlags().AddFlagSet(logs)
	tmpl := cmd.UsageTemplate()
	section := "{{if .HasHelpSubCommands}}"
	if !strings.Contains(tmpl, section) || strings.Contains(usages, "{{") {
		panic("gputopo: cannot place the logging flags in cobra's usage template")
	}
	cmd.SetUsageTemplate(strings.Replace(tmpl, section, "\n\nLogging flags (klog):\n"+usages+section, 1))
}

// usageError is a wrong command line: exit code 2.
type usageError struct {
	cmd *cobra.Command
	err error
}

func (e usageError) Error() string {
	return fmt.Sprintf("%v (see '%s --help')", e.err, e.cmd.CommandPath())
}

func (e usageError) Unwrap() error { return e.err }

// strictArgs makes every command refuse what it does not know: a command
// that holds subcommands names the unknown one and the known ones, and an
// argument count error is a usage error. (A command that only holds
// subcommands is not runnable, and cobra prints its help without checking
// its arguments: Execute checks them first.)
func strictArgs(c *cobra.Command) {
	for _, sub := range c.Commands() {
		strictArgs(sub)
	}
	if !c.HasSubCommands() {
		if args := c.Args; args != nil {
			c.Args = func(cmd *cobra.Command, a []string) error {
				if err := args(cmd, a); err != nil {
					return usageError{cmd: cmd, err: err}
				}
				return nil
			}
		}
		return
	}
	args := c.Args
	c.Args = func(cmd *cobra.Command, a []string) error {
		if len(a) > 0 && (args == nil || args(cmd, a) != nil || !cmd.Runnable()) {
			return unknownCommand(cmd, a[0])
		}
		return nil
	}
}

func unknownCommand(c *cobra.Command, name string) error {
	var known []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			known = append(known, sub.Name())
		}
	}
	msg := fmt.Sprintf("unknown command %q for %q", name, c.CommandPath())
	if s := c.SuggestionsFor(name); len(s) > 0 {
		msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
	}
	if len(known) > 0 {
		msg += fmt.Sprintf("; its commands: %s", strings.Join(known, ", "))
	}
	return usageError{cmd: c, err: errors.New(msg)}
}

// Execute runs gputopo with args (without the program name) and returns
// the process's exit code: 0, 1 when the command failed, 2 when the command
// line is wrong. An error is one line on errOut, "gputopo: <error>"; the
// components' own logs go through klog.
func Execute(ctx context.Context, args []string, out, errOut io.Writer) int {
	root := NewCommand(ctx)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	err := checkSubcommand(root, args)
	if err == nil {
		err = root.ExecuteContext(ctx)
	}
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(errOut, "gputopo: %v\n", err)
	var u usageError
	if errors.As(err, &u) {
		return ExitUsage
	}
	return ExitFailed
}

// checkSubcommand refuses `gputopo machine dump` (and `gputopo machine
// dump --help`) before cobra runs: cobra prints machine's help and exits 0
// for a command that only holds subcommands, or when help is asked, without
// checking the arguments.
func checkSubcommand(root *cobra.Command, args []string) error {
	c, rest, err := root.Find(args)
	if err != nil || !c.HasSubCommands() {
		return nil
	}
	help := slices.Contains(args, "--help") || slices.Contains(args, "-h")
	if c.Runnable() && !help {
		return nil // its Args check runs
	}
	// Nothing runs after this parse: cobra prints help, or refuses.
	c.InitDefaultHelpFlag()
	if err := c.ParseFlags(rest); err != nil {
		return nil // cobra reports it
	}
	if a := c.Flags().Args(); len(a) > 0 {
		return c.Args(c, a)
	}
	return nil
}
