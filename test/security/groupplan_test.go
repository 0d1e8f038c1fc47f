//go:build integration

package security

import (
	"context"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/kubectlplugin"
	"github.com/gputopo/gputopo/test/harness"
)

// What the scheduler holds for groups (GroupPlan) is written by the decider
// alone, with the chart's RBAC: as a tenant with pod-create rights in its
// namespace, as a compromised node agent and as a viewer of kubectl
// gputopo, creating, changing or deleting one is refused (the node agent
// with its real service-account token, bound to its pod); the decider's
// rules allow it, and the viewer may list them.
func TestOnlyTheDeciderWritesGroupPlans(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := context.Background()
	c := cp.Client
	grant := func(user string, rules []rbacv1.PolicyRule, namespace string) {
		t.Helper()
		subj := []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: user}}
		if namespace != "" {
			role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user}, Rules: rules}
			rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: user}, Subjects: subj,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user}}
			for _, o := range []client.Object{role, rb} {
				if err := c.Create(ctx, o); err != nil {
					t.Fatal(err)
				}
			}
			return
		}
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: rules}
		rb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subj,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user}}
		for _, o := range []client.Object{role, rb} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Create(ctx, namespace("team", false)); err != nil {
		t.Fatal(err)
	}
	grant("tenant", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"}}}, "team")
	// The node agent as the chart runs it: its service account and
	// ClusterRole, and a token kubelet would mount into its pod.
	for _, o := range append([]client.Object{namespace(whRelease, false)}, agentAccount()...) {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cp.CreateGPUNode(t, nodeA, 8, nil)
	agentPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: whRelease, Name: "gputopo-nodeagent-a"},
		Spec: corev1.PodSpec{ServiceAccountName: agentSA, NodeName: nodeA, Containers: []corev1.Container{{Name: "agent", Image: "ghcr.io/gputopo/gputopo:0.2.0"}}}}
	if err := c.Create(ctx, agentPod); err != nil {
		t.Fatal(err)
	}
	agent := agentClient(t, cp, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID})
	grant("viewer", kubectlplugin.ViewerRules(), "")
	grant("decider", extender.RBACRules(), "")
	as := func(user string) client.Client {
		t.Helper()
		if user == "agent" {
			return agent
		}
		uc, err := client.New(cp.UserConfig(t, user), client.Options{Scheme: c.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		return uc
	}
	plan := func() *v1alpha1.GroupPlan {
		return &v1alpha1.GroupPlan{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "llm"}, Spec: v1alpha1.GroupPlanSpec{
			State: v1alpha1.GroupKept, Since: metav1.Now(), Slots: []v1alpha1.GroupPlanSlot{{Node: "n0", GPUs: []int{0, 1}}}}}
	}
	for _, user := range []string{"tenant", "agent", "viewer"} {
		if err := as(user).Create(ctx, plan()); !apierrors.IsForbidden(err) {
			t.Errorf("%s created a GroupPlan: %v, want forbidden", user, err)
		}
	}
	decider := as("decider")
	if err := decider.Create(ctx, plan()); err != nil {
		t.Fatalf("the decider could not create a GroupPlan: %v", err)
	}
	for _, user := range []string{"tenant", "agent", "viewer"} {
		o := &v1alpha1.GroupPlan{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(plan()), o); err != nil {
			t.Fatal(err)
		}
		o.Spec.Slots = nil
		if err := as(user).Update(ctx, o); !apierrors.IsForbidden(err) {
			t.Errorf("%s changed a GroupPlan: %v, want forbidden", user, err)
		}
		if err := as(user).Delete(ctx, plan()); !apierrors.IsForbidden(err) {
			t.Errorf("%s deleted a GroupPlan: %v, want forbidden", user, err)
		}
	}
	var l v1alpha1.GroupPlanList
	if err := as("viewer").List(ctx, &l); err != nil || len(l.Items) != 1 {
		t.Errorf("viewer lists %d GroupPlans (%v), want 1", len(l.Items), err)
	}
	if err := decider.Delete(ctx, plan()); err != nil {
		t.Errorf("the decider could not delete its GroupPlan: %v", err)
	}
}
