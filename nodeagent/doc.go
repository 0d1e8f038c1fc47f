// Package nodeagent is gputopo's per-node agent: it discovers the node's
// GPUs, their links, health and load through NVML, publishes them in the
// node's NodeGPUTopology, serves the kubelet device plugin for nvidia.com/gpu
// that turns the extender's plan into kubelet's allocation, and records what
// each pod really got from kubelet's PodResources API.
//
// NVML sits behind go-nvml's nvml.Interface, so the same discovery code runs
// against the real driver, go-nvml's mocks in tests, and the simulated node
// built from a topology fixture. The package may import api/v1alpha1 and
// topology; it must never import the webhook, the extender or cmd.
package nodeagent
