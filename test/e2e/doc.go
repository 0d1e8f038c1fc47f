// Package e2e runs the whole of gputopo on one machine, as a cluster runs
// it: the real kube-apiserver and etcd, the real kube-scheduler with the
// chart's scheduler profile, the real kube-controller-manager's Job
// controller, the webhook and the extender in process, and a real kubelet
// (fake CRI runtime) whose device plugin is the node agent on simulated
// NVML. It proves the flow of one Job hop by hop, then injects faults and
// hostile input, and after every scenario audits that the extender's
// ledger, kubelet's PodResources, the container's environment and the
// pods' annotations agree and that no GPU is in two live pods.
//
// The tests carry the integration build tag and need root (the kubelet
// mounts its root directory) and the binaries in bin/ (make tools):
//
//	go test -tags integration -count=1 -v ./test/e2e/
//
// Nothing imports this package; it must never be imported by a component.
package e2e
