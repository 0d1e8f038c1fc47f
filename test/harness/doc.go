// Package harness starts the real Kubernetes control plane on one machine for
// gputopo's integration and end-to-end tests: etcd and kube-apiserver through
// controller-runtime's envtest, and the real kube-scheduler (and other
// upstream binaries) as child processes. The binaries come from bin/, built
// by hack/tools from the Go module proxy.
//
// Everything a test starts is stopped in t.Cleanup, pass or fail. The
// package must never import a gputopo component: components import it from
// their tests, not the other way round.
package harness
