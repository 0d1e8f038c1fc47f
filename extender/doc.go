// Package extender is gputopo's kube-scheduler extender, the HTTP front
// end of the decision core (package placement): the verbs filter,
// prioritize and bind over the k8s.io/kube-scheduler/extender/v1 types,
// translated into the core's Request and answers; TLS with client
// certificates; shadow mode (mirroring and comparing decisions); leader
// election among replicas; and its options and flags.
//
// Every decision is the core's, made from informer state kept in memory; a
// request never reads the API server. Only bind writes (one Binding) and,
// when the outcome of that write is unknown, reads the pod back.
//
// It imports the core, its metrics, topology and api. It must never import
// another front end (schedplugin, webhook, nodeagent, kubectlplugin,
// simulator) nor the test harness; cmd wires it (test/layering).
package extender
