// Package kubectlplugin is `kubectl gputopo`: what gputopo sees, shown to
// operators. It reads the cluster with the user's kubeconfig only (Nodes,
// NodeGPUTopology objects, Pods, and, when it may, the extender's
// ConfigMap, Events and Jobs: ViewerRules) and draws nodes, their GPUs and
// links, GPU pods, and what will happen to a pod: the scheduler it asked
// for, its PodScheduled condition and events, then every node's verdict;
// for a Job whose pods the webhook refuses, its FailedCreate events.
//
// explain runs the decision core itself (placement.New fed from the
// listed objects, then Filter and Explain, and ExplainGroup for a pod of
// a group) rather than a second
// implementation of its verdicts, so that its reasons are the ones
// kube-scheduler's FailedScheduling event carries.
//
// It imports the decision core, internal/picture (WriteSVG), topology and
// api; no component imports it, and its binary links neither the HTTP
// extender nor a fake clientset (TestKubectlBinaryLinksNoServerNorFake).
// cmd/kubectl-gputopo wires it.
package kubectlplugin
