package nodeagent

import rbacv1 "k8s.io/api/rbac/v1"

// RBACRules are exactly the permissions the node agent uses, for its
// ClusterRole (the Helm chart grants these; the integration tests run the
// agent with nothing more).
func RBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// Publisher: read-or-create the node's object, write its status.
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies"}, Verbs: []string{"get", "create"}},
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies/status"}, Verbs: []string{"update"}},
		// Publisher: the Node's UID for the owner reference.
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		// Pod cache (plans) and reconciler (allocated-gpus).
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		// GPUAssignmentDrift Events (the recorder patches repeats).
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
	}
}
