// Command gputopo-scheduler is kube-scheduler with gputopo's scheduler
// plugin (package schedplugin, registered as GPUTopology) compiled in: the
// upstream command, flags and configuration, plus a profile that enables
// the plugin decides GPU pods in-process instead of through the HTTP
// extender. It is its own module so that the main module does not depend
// on k8s.io/kubernetes; `make gputopo-scheduler` builds it into bin/,
// stamped with the Kubernetes version it contains. See
// docs/scheduler-plugin.md.
package main

import (
	"fmt"
	"os"
	"time"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gputopo/gputopo/schedplugin"
)

// shutdownWait bounds how long the process waits, once the scheduler has
// stopped, for the plugin to release its decider Lease: the Bindings in
// flight (at most the bind timeout, 10s by default) and one Lease update.
const shutdownWait = 15 * time.Second

func main() {
	cmd := app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, schedplugin.New))
	code := cli.Run(cmd)
	if !schedplugin.AwaitShutdown(shutdownWait) {
		fmt.Fprintf(os.Stderr, "gputopo-scheduler: the decider Lease was not released within %s; the next scheduler takes it when it expires\n", shutdownWait)
	}
	os.Exit(code)
}
