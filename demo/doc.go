// Package demo runs the whole of gputopo on one machine: a real etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, the webhook,
// the extender, and a simulated node agent per node of a mixed GPU cluster;
// then it submits jobs and shows where their GPUs landed. It places the
// same jobs on the same nodes through plain kube-scheduler in a second
// control plane, each pod's GPUs chosen as NVIDIA's device plugin chooses
// them (go-gpuallocator's best-effort policy on the node's simulated
// NVML), and compares the two job by job.
//
// It is wiring and presentation only: every decision is made by the
// components it starts, or by the plain path's real kube-scheduler and
// NVIDIA's allocator. Only cmd/gputopo imports it.
package demo
