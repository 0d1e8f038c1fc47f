package nodeagent

import rbacv1 "k8s.io/api/rbac/v1"

// RBACRules are exactly the permissions the node agent uses, for its
// ClusterRole (the Helm chart grants these, rule for rule, and test/chart
// compares them; the integration tests run the agent with nothing more).
//
// Pods: the agent must patch the pods on its own node (allocated-gpus).
// RBAC cannot narrow a verb to pods of one node; the agent's admission
// policies (AdmissionPolicies) do inside kube-apiserver, by the node name
// it records in the agent's pod-bound service account token
// (authentication.kubernetes.io/node-name), and so does the webhook for
// the system annotations.
func RBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		// Publisher: read-or-create the node's object, write its status.
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies"}, Verbs: []string{"get", "create"}},
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies/status"}, Verbs: []string{"update"}},
		// Publisher: the Node's UID for the owner reference.
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
		// Pod cache (plans) and reconciler (allocated-gpus).
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		// GPUAssignmentDrift Events: client-go's recorder creates an Event
		// and patches it when the same Event repeats; it never updates one.
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
}
