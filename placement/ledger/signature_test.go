package ledger

import (
	"reflect"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// TestSignatureCoversEveryFieldOfGPUsAndLinks: changing any field of any
// GPU or link changes the signature, so a field added to either type
// later cannot be left out of the rebuild decision unnoticed; the stored
// topologyHash, telemetry and times do not.
func TestSignatureCoversEveryFieldOfGPUsAndLinks(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	l := New(Options{})
	base := f.Graph("a").Status()
	want := l.signature(&base)
	// bump changes one field to another value of its kind.
	bump := func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Int, reflect.Int64, reflect.Int32:
			v.SetInt(v.Int() + 1)
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Bool:
			v.SetBool(!v.Bool())
		default:
			t.Fatalf("field of kind %s: teach the test (and Ledger.signature) about it", v.Kind())
		}
	}
	for _, part := range []struct {
		name string
		get  func(st *v1alpha1.NodeGPUTopologyStatus) reflect.Value
	}{
		{"gpus[3]", func(st *v1alpha1.NodeGPUTopologyStatus) reflect.Value { return reflect.ValueOf(&st.GPUs[3]).Elem() }},
		{"links[5]", func(st *v1alpha1.NodeGPUTopologyStatus) reflect.Value { return reflect.ValueOf(&st.Links[5]).Elem() }},
	} {
		typ := part.get(&base).Type()
		for i := 0; i < typ.NumField(); i++ {
			st := f.Graph("a").Status()
			bump(part.get(&st).Field(i))
			if l.signature(&st) == want {
				t.Errorf("changing %s.%s leaves the signature unchanged", part.name, typ.Field(i).Name)
			}
		}
	}
	st := f.Graph("a").Status()
	st.TopologyHash = "something else"
	st.DriverVersion = "999.0"
	st.Telemetry = []v1alpha1.Telemetry{{Index: 0, UtilizationPercent: 90}}
	if l.signature(&st) != want {
		t.Error("topologyHash, the driver version or telemetry changed the signature")
	}
	less := f.Graph("a").Status()
	less.Links = less.Links[:len(less.Links)-1]
	if l.signature(&less) == want {
		t.Error("dropping a link leaves the signature unchanged")
	}
}

// BenchmarkSignature is the cost a telemetry round adds per node: the
// signature of an 8-GPU topology (28 links).
func BenchmarkSignature(b *testing.B) {
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		b.Fatal(err)
	}
	l := New(Options{})
	st := f.Graph("a").Status()
	b.ReportAllocs()
	for b.Loop() {
		_ = l.signature(&st)
	}
}
