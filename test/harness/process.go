package harness

import (
	"path/filepath"
	"testing"

	"github.com/gputopo/gputopo/internal/localcluster"
)

// Process is a child process started for a test.
type Process = localcluster.Process

// StartProcess starts bin with args, logging to the test's temp dir, and
// stops it in t.Cleanup; when the test failed, the last lines of its log are
// printed so a failed run shows what the binary said.
func StartProcess(t testing.TB, name, bin string, args ...string) *Process {
	t.Helper()
	p, err := localcluster.StartProcess(name, filepath.Join(t.TempDir(), name+".log"), bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		reportLog(t, name, p.LogPath, p.Tail)
	})
	return p
}
