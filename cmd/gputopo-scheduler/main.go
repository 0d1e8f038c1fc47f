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
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gputopo/gputopo/schedplugin"
)

func main() {
	cmd := app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, schedplugin.New))
	os.Exit(cli.Run(cmd))
}
