package extender

import rbacv1 "k8s.io/api/rbac/v1"

// ClusterRBACRules are exactly the cluster-wide permissions the extender
// uses: the Helm chart's extender ClusterRole is this list, rule for rule
// (test/chart compares them). The extender reads Nodes and
// NodeGPUTopologies only through its informers (list, watch), reads a
// single pod back only when a bind's outcome is unknown, and records only
// GPUDoubleHeld Events.
func ClusterRBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// Informers: GPU pods, and the pod read that settles an ambiguous bind.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		// Bind: node and GPUs in one write.
		{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies"}, Verbs: []string{"list", "watch"}},
		// Kubernetes PodGroups (scheduling.k8s.io), where the cluster
		// serves them: a group's size and topology constraint.
		{APIGroups: []string{"scheduling.k8s.io"}, Resources: []string{"podgroups"}, Verbs: []string{"list", "watch"}},
		// DRA (resource.k8s.io), where the cluster serves it: GPUs
		// allocated through ResourceClaims, resolved to UUIDs through the
		// driver's ResourceSlices (docs/dra.md).
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceclaimtemplates", "resourceslices"}, Verbs: []string{"list", "watch"}},
		// Preemption: the PodDisruptionBudgets of the victims the preempt
		// verb returns, counted as kube-scheduler counts them.
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"list", "watch"}},
		// What the decider holds for groups, published (GroupPlan): written
		// by the decider alone, read back by the next one.
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"groupplans"}, Verbs: []string{"get", "list", "create", "update", "delete"}},
		// GPUDoubleHeld Events: client-go's recorder creates an Event and
		// patches it when the same Event repeats; it never updates one.
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}

// LeaderElectionRBACRules are the permissions leader election needs on
// the Lease named lease (--leader-election-id), for a Role in the Lease's
// namespace (--leader-election-namespace). create cannot be limited by
// name: the name of an object is not known to RBAC before it exists.
func LeaderElectionRBACRules(lease string) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{lease}, Verbs: []string{"get", "update"}},
	}
}

// RBACRules are every permission the extender uses in one list, for a
// single ClusterRole (docs/extender.md lists them; the integration and e2e
// tests run it with nothing more): ClusterRBACRules plus the Lease verbs
// of LeaderElectionRBACRules, on any Lease. Installs grant the Lease verbs
// in a Role on the one Lease instead, as the chart does.
func RBACRules() []rbacv1.PolicyRule {
	return append(ClusterRBACRules(),
		rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}})
}
