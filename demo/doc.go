// Package demo runs the whole of gputopo on one machine: a real etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler, the webhook,
// the extender, and a simulated node agent per node of a mixed GPU cluster;
// then it submits jobs and shows where their GPUs landed, against what
// count-only scheduling would have given.
//
// It is wiring and presentation only: every decision is made by the
// components it starts. Only cmd/gputopo imports it.
package demo
