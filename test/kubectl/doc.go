// Package kubectl tests `kubectl gputopo` on the real control plane: the
// demo's runner (demo.Run: etcd, kube-apiserver, kube-scheduler with the
// extender, kube-controller-manager, the webhook, node agents on simulated
// NVML) places a fixed set of workloads, then every subcommand's table and
// JSON output is compared with golden files, explain is checked against
// kube-scheduler's FailedScheduling event, explain --job against the job
// controller's FailedCreate events for pods the webhook refuses, and the
// plugin is run through kubectl's own plugin discovery. A second test runs
// kube-scheduler against an extender address where nothing listens and
// checks what explain shows of the SchedulerError, as a user holding only
// the documented ClusterRole. Build-tagged integration.
package kubectl
