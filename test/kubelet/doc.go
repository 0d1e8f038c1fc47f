// Package kubelet runs a real kubelet for integration tests: the upstream
// binary from bin/, registered with a harness control plane, against an
// in-process fake CRI runtime that records every container config kubelet
// sends (env included), so a test can check what a container would have
// seen without a container engine or a GPU.
//
// With Options.Containerd the same kubelet runs on a real runtime instead:
// containerd from bin/ (`make tools`) with Debian's runc and CNI plugins,
// images imported from the OCI archives `make image` writes (nothing is
// pulled), and a test reads what a container's process really received
// from /proc/<pid>/environ and its /dev (Containerd.PID, Environ,
// GPUDeviceNodes), and what kubelet asked containerd for and containerd
// made of it (Containerd.Inspect: the CRI ContainerConfig and the OCI
// runtime spec). WriteCDISpec gives containerd a CDI spec for simulated
// GPUs, as nvidia-ctk cdi generate would on a real node. Teardown removes
// every pod and fails the test if a shim, mount, cgroup or the CNI bridge
// is left behind.
//
// kubelet's device manager uses the fixed directory
// /var/lib/kubelet/device-plugins, so only one such kubelet may run on a
// machine at a time: Start holds an exclusive lock on LockPath for the
// test's lifetime, which serialises test packages run in parallel. Tests
// must run as root (kubelet bind-mounts its root directory).
//
// The package must never import a gputopo component.
package kubelet
