// Package v1alpha1 is gputopo's wire contract: the annotation and label keys
// the components exchange through pods, the GPU topology requirement and
// placement record that travel in those annotations, and the NodeGPUTopology
// custom resource.
//
// It must never import NVML, client-go clients or any gputopo component:
// every other package imports it, and it imports only API machinery.
//
// +kubebuilder:object:generate=true
// +groupName=gputopo.io
package v1alpha1
