package harness

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// KeepLogsEnv names a directory where a failed test's child-process logs
// are copied whole (the test's temp dir, where they are written, goes
// when the test ends): GPUTOPO_TEST_LOGS=_out/logs go test ...
const KeepLogsEnv = "GPUTOPO_TEST_LOGS"

// reportLog, in a cleanup, prints the last lines of name's log at path
// when t failed, and keeps the whole log under $GPUTOPO_TEST_LOGS when
// that is set, named after the test and the process.
func reportLog(t testing.TB, name, path string, tail func(int) string) {
	if !t.Failed() {
		return
	}
	t.Logf("last lines of %s log (%s):\n%s", name, path, tail(40))
	dir := os.Getenv(KeepLogsEnv)
	if dir == "" {
		return
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("keeping %s log: %v", name, err)
		return
	}
	safe := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name() + "." + name + ".log")
	if err := os.MkdirAll(dir, 0o755); err == nil {
		err = os.WriteFile(filepath.Join(dir, safe), b, 0o644)
	}
	if err != nil {
		t.Logf("keeping %s log: %v", name, err)
		return
	}
	t.Logf("%s log kept whole in %s", name, filepath.Join(dir, safe))
}
