// Package webhook is gputopo's admission webhook: it turns a workload's
// stated intent (gputopo.io/parallelism on a Pod, its Job or its Namespace)
// into a GPU topology requirement, routes GPU pods to the gputopo scheduler
// profile, labels them with their job identity, makes the pods of a Job
// that runs several at once a group placed all or nothing (JobMutator), and
// refuses every write of the fields that decide which GPUs a pod gets
// unless it comes from gputopo's own service accounts.
//
// Mutation (PodMutator, JobMutator) and validation (PodValidator) are
// separate handlers: the validating webhook runs after every mutating
// webhook, so it judges the object that will be stored, including changes a
// third-party mutating webhook made after ours.
//
// It must never import the extender, the node agent or the topology
// allocator: it speaks to them only through the annotations of
// api/v1alpha1, and names strategies, never implements them.
package webhook
