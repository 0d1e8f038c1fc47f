// Package localcluster runs upstream Kubernetes binaries from bin/ as child
// processes on one machine: process lifecycle with log files, free ports,
// health waits, and kube-scheduler with a KubeSchedulerConfiguration. The
// test harness (test/harness) and `gputopo demo` both build on it, so the
// demo runs the control plane exactly as the tests do.
//
// It sits in the composition layer, with demo and cmd: it runs gputopo's
// extender and scheduler (system.go) beside the upstream binaries and so
// imports those front ends; no component imports it (test/layering).
package localcluster
