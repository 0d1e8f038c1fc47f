package kubectlplugin

import rbacv1 "k8s.io/api/rbac/v1"

// ViewerRules are what `kubectl gputopo` reads, as the rules of a
// ClusterRole for the users who run it (docs/troubleshooting.md prints
// them). It writes nothing. Without the last four explain goes on and
// says what it could not read: the extender's ConfigMap (the defaults are
// used), the events (none shown), Jobs (explain --job then selects the
// Job's events by name alone) and DRA's claims and slices (GPUs held
// through ResourceClaims are not shown).
func ViewerRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes", "pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{"gputopo.io"}, Resources: []string{"nodegputopologies", "groupplans"}, Verbs: []string{"list"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get"}, ResourceNames: []string{"gputopo-extender"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims", "resourceslices"}, Verbs: []string{"list"}},
	}
}
