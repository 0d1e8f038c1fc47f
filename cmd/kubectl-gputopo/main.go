// Command kubectl-gputopo is the kubectl plugin `kubectl gputopo`: put it
// on PATH and kubectl finds it.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/kubectlplugin"
)

func main() {
	// The extender core explain runs logs as a component would (a GPU held
	// twice, for one); the plugin's output says it in its own words.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := kubectlplugin.NewCommand(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
