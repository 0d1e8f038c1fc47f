// Command gputopo is the single binary of gputopo: webhook, extender,
// nodeagent, simulate, machine, demo and version are its subcommands. The
// main only wires a signal context, the logger and the command; see package
// app.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/cmd/gputopo/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	klog.Flush()
	os.Exit(code)
}
