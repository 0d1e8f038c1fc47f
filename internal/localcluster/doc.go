// Package localcluster runs upstream Kubernetes binaries from bin/ as child
// processes on one machine: process lifecycle with log files, free ports,
// health waits, and kube-scheduler with a KubeSchedulerConfiguration. The
// test harness (test/harness) and `gputopo demo` both build on it, so the
// demo runs the control plane exactly as the tests do.
//
// It must never import a gputopo component.
package localcluster
