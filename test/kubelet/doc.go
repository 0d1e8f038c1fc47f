// Package kubelet runs a real kubelet for integration tests: the upstream
// binary from bin/, registered with a harness control plane, against an
// in-process fake CRI runtime that records every container config kubelet
// sends (env included), so a test can check what a container would have
// seen without a container engine or a GPU.
//
// kubelet's device manager uses the fixed directory
// /var/lib/kubelet/device-plugins, so only one such kubelet may run on a
// machine at a time: Start holds an exclusive lock on LockPath for the
// test's lifetime, which serialises test packages run in parallel. Tests
// must run as root (kubelet bind-mounts its root directory).
//
// The package must never import a gputopo component.
package kubelet
