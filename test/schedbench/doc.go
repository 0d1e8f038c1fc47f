// Package schedbench measures kube-scheduler throughput and latency with
// and without the gputopo extender: the real kube-apiserver and the real
// kube-scheduler binary (from bin/, make tools), N GPU nodes with
// NodeGPUTopology objects, M GPU pods, both schedulers in one process run
// on one node set. It is behind the build tag schedbench (make
// bench-scheduler) because it takes minutes; see docs/benchmarks.md.
//
// Nothing may import it.
package schedbench
