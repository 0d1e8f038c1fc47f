// Package nodeagent holds the node agent's integration tests (build tag
// integration): the real agent against a real kube-apiserver and a real
// kubelet with a fake CRI runtime, its NVML path on a simulated node. Run
// them with `go test -tags integration -p 1 ./test/nodeagent/...` as root.
//
// The package has no code of its own; it must never be imported.
package nodeagent
