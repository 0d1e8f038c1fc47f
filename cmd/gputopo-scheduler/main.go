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
	"runtime/pprof"
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

// cpuProfileEnv names a file to write a CPU profile of the whole run to,
// and heapProfileEnv one to write a heap profile to when the scheduler
// stops, when set (docs/benchmarks.md: profiling the plugin build under
// the scheduler benchmark).
const (
	cpuProfileEnv  = "GPUTOPO_CPU_PROFILE"
	heapProfileEnv = "GPUTOPO_HEAP_PROFILE"
)

func main() {
	stopProfile := startCPUProfile(os.Getenv(cpuProfileEnv))
	cmd := app.NewSchedulerCommand(app.WithPlugin(schedplugin.Name, schedplugin.New), app.WithPlugin(draName, newDRA))
	code := cli.Run(cmd)
	stopProfile()
	writeHeapProfile(os.Getenv(heapProfileEnv))
	if !schedplugin.AwaitShutdown(shutdownWait) {
		fmt.Fprintf(os.Stderr, "gputopo-scheduler: the decider Lease was not released within %s; the next scheduler takes it when it expires\n", shutdownWait)
	}
	os.Exit(code)
}

// startCPUProfile profiles the process into path until the returned stop
// is called; "" profiles nothing. A profile that cannot start is reported
// and the scheduler runs without it.
func startCPUProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gputopo-scheduler: %s: %v; running without a CPU profile\n", cpuProfileEnv, err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(os.Stderr, "gputopo-scheduler: %s: %v; running without a CPU profile\n", cpuProfileEnv, err)
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "gputopo-scheduler: %s: %v\n", cpuProfileEnv, err)
		}
	}
}

// writeHeapProfile writes the heap profile into path; "" writes nothing.
func writeHeapProfile(path string) {
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("heap").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gputopo-scheduler: %s: %v\n", heapProfileEnv, err)
	}
}
