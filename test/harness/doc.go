// Package harness starts the real Kubernetes control plane on one machine for
// gputopo's integration and end-to-end tests: etcd and kube-apiserver through
// controller-runtime's envtest, and the real kube-scheduler (and other
// upstream binaries) as child processes. The binaries come from bin/, built
// by hack/tools from the Go module proxy.
//
// Everything a test starts is stopped in t.Cleanup, pass or fail. It starts
// gputopo's own processes through internal/localcluster and so imports the
// front ends that does (extender, schedplugin); components import it only
// from their integration tests, never from shipped code (test/layering).
package harness
