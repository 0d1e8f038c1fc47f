package nodeagent

import (
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// TestFlagsAreTheConfiguration: every field of the node agent's
// configuration has its flag, whose default is the configuration's, and
// Validate names that flag.
func TestFlagsAreTheConfiguration(t *testing.T) {
	t.Setenv("NODE_NAME", "n1")
	var o Options
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	want := configv1alpha1.DefaultNodeAgentConfiguration()
	want.NodeName = "n1"
	if diff := cmp.Diff(want, o.NodeAgentConfiguration); diff != "" {
		t.Errorf("flag defaults (-configuration defaults +flags):\n%s", diff)
	}
	typ := reflect.TypeFor[configv1alpha1.NodeAgentConfiguration]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if f.Anonymous {
			continue // TypeMeta
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		flag, ok := flagNames[name]
		if !ok || fs.Lookup(flag) == nil {
			t.Errorf("field %s has no flag (flagNames[%q] = %q)", f.Name, name, flag)
		}
	}
}
