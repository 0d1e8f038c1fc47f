// Package machine describes real machines' GPU topologies and builds them
// as topology.Graphs: the built-in fixtures (Fixtures), machine files
// (Parse, Load, Fixture.Marshal), the importers of `nvidia-smi topo -m`
// (ImportSMI, and RenderSMI, which prints it back) and of NCCL topology
// dumps (ImportNCCLTopo), the GPU catalogue the importers consult
// (GPUKind), and synthetic nodes larger than any fixture for tests and
// benchmarks.
//
// It imports the model (topology) and api/v1alpha1 and, for machine files,
// sigs.k8s.io/yaml, sigs.k8s.io/json and apimachinery's field validation:
// never topology/allocator (its tests do), NVML, client-go, or any gputopo
// component.
package machine
