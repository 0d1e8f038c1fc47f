package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSplice(t *testing.T) {
	doc := "intro\n<!-- begin a -->\nold\n<!-- end a -->\noutro\n"
	got, err := splice(doc, "a", "new 1\nnew 2\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n<!-- begin a -->\nnew 1\nnew 2\n<!-- end a -->\noutro\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("spliced (-want +got):\n%s", diff)
	}
	again, err := splice(got, "a", "new 1\nnew 2\n")
	if err != nil || again != got {
		t.Errorf("splicing the same body twice changed the document: %q, %v", again, err)
	}
	if _, err := splice(doc, "b", "x\n"); err == nil || !strings.Contains(err.Error(), "section b") {
		t.Errorf("missing section: error %v, want one naming section b", err)
	}
}
