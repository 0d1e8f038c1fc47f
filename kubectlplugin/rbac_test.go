package kubectlplugin

import (
	"os"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// The ClusterRole docs/troubleshooting.md gives the plugin's users is
// ViewerRules, which the integration test grants and runs every command
// with.
func TestDocumentedClusterRoleIsViewerRules(t *testing.T) {
	doc, err := os.ReadFile("../docs/troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: gputopo-viewer\n.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/troubleshooting.md has no ClusterRole gputopo-viewer block")
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(m[1], &role); err != nil {
		t.Fatalf("the documented ClusterRole: %v", err)
	}
	if diff := cmp.Diff(ViewerRules(), role.Rules); diff != "" {
		t.Errorf("docs/troubleshooting.md's ClusterRole differs from ViewerRules (-code +doc):\n%s", diff)
	}
}
