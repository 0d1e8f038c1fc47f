package extender

import rbacv1 "k8s.io/api/rbac/v1"

// RBACRules are exactly the permissions the extender uses (docs/extender.md
// lists them); the integration and e2e tests run it with nothing more.
func RBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// Informers: GPU pods, and the pod read that settles an ambiguous bind.
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		// Bind: node and GPUs in one write.
		{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies"}, Verbs: []string{"list", "watch"}},
		// GPUDoubleHeld Events: client-go's recorder creates an Event and
		// patches it when the same Event repeats; it never updates one.
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		// Leader election.
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}},
	}
}
