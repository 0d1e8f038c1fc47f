//go:build integration

package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/placement/cluster"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/gputopo/gputopo/extender"
)

// TestDeciderLeaseRBACAndFlags: in either mode the deciding component (the
// extender, or gputopo-scheduler in plugin mode) may take and renew
// exactly the decider Lease, in the namespace its flags or plugin args
// name, and the Lease name follows the GPU resource as the code derives
// it.
func TestDeciderLeaseRBACAndFlags(t *testing.T) {
	renamed := release{name: "gputopo", namespace: "gputopo-system", values: `
gpuResourceName: example.com/gpu
deciderLease:
  namespace: gputopo-shared
`}
	for name, tc := range map[string]struct {
		rel       release
		decider   string
		namespace string
		lease     string
	}{
		"extender mode":           {defaultRelease, "-extender", "kube-system", cluster.DeciderLeaseName("nvidia.com/gpu")},
		"plugin mode":             {pluginRelease, "-scheduler", "kube-system", cluster.DeciderLeaseName("nvidia.com/gpu")},
		"another resource and ns": {renamed, "-extender", "gputopo-shared", cluster.DeciderLeaseName("example.com/gpu")},
	} {
		t.Run(name, func(t *testing.T) {
			objs := tc.rel.render(t)
			fn := tc.rel.fullname()
			var role rbacv1.Role
			roleName := tc.rel.namespace + "-" + fn + "-decider"
			into(t, find(t, objs, "Role", roleName), &role)
			if role.Namespace != tc.namespace {
				t.Errorf("decider Role in namespace %q, want %q", role.Namespace, tc.namespace)
			}
			if diff := cmp.Diff(extender.LeaderElectionRBACRules(tc.lease), role.Rules); diff != "" {
				t.Errorf("decider Role differs from extender.LeaderElectionRBACRules(%s) (-code +chart):\n%s", tc.lease, diff)
			}
			var b rbacv1.RoleBinding
			into(t, find(t, objs, "RoleBinding", roleName), &b)
			want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: fn + tc.decider, Namespace: tc.rel.namespace}}
			if b.Namespace != tc.namespace || b.RoleRef.Name != role.Name || !cmp.Equal(want, b.Subjects) {
				t.Errorf("decider RoleBinding %s/%s binds %s to %v; want %s/%s binding %s to %v", b.Namespace, b.Name, b.RoleRef.Name, b.Subjects, tc.namespace, role.Name, role.Name, want)
			}
			if tc.decider == "-scheduler" {
				_, args := pluginScheduler(t, objs, fn)
				if args.DeciderLeaseNamespace != tc.namespace || args.DeciderLeaseName != tc.lease {
					t.Errorf("plugin args decider lease %s/%s, want %s/%s", args.DeciderLeaseNamespace, args.DeciderLeaseName, tc.namespace, tc.lease)
				}
				return
			}
			var dep appsv1.Deployment
			into(t, find(t, objs, "Deployment", fn+"-extender"), &dep)
			a := dep.Spec.Template.Spec.Containers[0].Args
			for _, flag := range []string{"--decider-lease-namespace=" + tc.namespace, "--decider-lease-name=" + tc.lease} {
				if !slices.Contains(a, flag) {
					t.Errorf("extender args %s lack %s", strings.Join(a, " "), flag)
				}
			}
		})
	}
}
