package v1alpha1

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// checkGolden compares v, as indented JSON, with testdata/<component>/
// defaults.json, and returns the golden file's content. UPDATE_GOLDEN=1
// writes the file first, so a change of defaults shows up as its diff in
// review.
func checkGolden(t *testing.T, component string, v any) []byte {
	t.Helper()
	got, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", component, "defaults.json")
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with UPDATE_GOLDEN=1 to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("defaults changed (-golden +now); if intended, run UPDATE_GOLDEN=1 go test ./api/config/v1alpha1 -run %s:\n%s", t.Name(), diff)
	}
	return want
}

// parseCase is a file and what parsing it gives: the defaults as want
// changes them, or exactly the error wantErr.
type parseCase[T any] struct {
	in      string
	want    func(*T)
	wantErr string
}

// runParseCases parses each case's file over defaults.
func runParseCases[T any](t *testing.T, parse func([]byte) (T, error), defaults func() T, tests map[string]parseCase[T]) {
	t.Helper()
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parse([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, want %q", tc.wantErr)
				}
				if diff := cmp.Diff(tc.wantErr, err.Error()); diff != "" {
					t.Errorf("error (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			want := defaults()
			tc.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}
