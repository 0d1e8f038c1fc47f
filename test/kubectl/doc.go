// Package kubectl tests `kubectl gputopo` on the real control plane: the
// demo's runner (demo.Run: etcd, kube-apiserver, kube-scheduler with the
// extender, kube-controller-manager, the webhook, node agents on simulated
// NVML) places a fixed set of workloads, then every subcommand's table and
// JSON output is compared with golden files, explain is checked against
// kube-scheduler's FailedScheduling event, and the plugin is run through
// kubectl's own plugin discovery. Build-tagged integration.
package kubectl
