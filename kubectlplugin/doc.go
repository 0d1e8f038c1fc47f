// Package kubectlplugin is `kubectl gputopo`: what gputopo sees, shown to
// operators. It reads the cluster with the user's kubeconfig only (Nodes,
// NodeGPUTopology objects, Pods, and the extender's ConfigMap when it may)
// and draws nodes, their GPUs and links, GPU pods, and why a pod is Pending.
//
// explain runs the extender's own decision code (extender.NewWithClient
// fed from the listed objects, then Filter and Explain) rather than a
// second implementation of its verdicts, so that its reasons are the ones
// kube-scheduler's FailedScheduling event carries.
//
// It imports the extender core, the demo's picture (WriteSVG), topology
// and api; no component imports it. cmd/kubectl-gputopo wires it.
package kubectlplugin
