package harness

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is a child process started for a test. Its output goes to a log
// file in the test's temp dir; the last lines are printed when the test
// fails, so a failed run shows what the binary said.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	mu      sync.Mutex
	exitErr error
}

// StartProcess starts bin with args and registers its termination in
// t.Cleanup. The process gets its own process group so that it and any
// children are killed together.
func StartProcess(t testing.TB, name, bin string, args ...string) *Process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("create log for %s: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("last lines of %s log (%s):\n%s", name, logPath, p.Tail(40))
		}
	})
	return p
}

// Stop sends SIGTERM to the process group, then SIGKILL after 10 seconds.
// It is safe to call more than once.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// Kill stops the process at once with SIGKILL, as a crash would.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return true, p.exitErr
	default:
		return false, nil
	}
}

// Tail returns the last n lines of the process log.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// LogContains reports whether the process log contains s.
func (p *Process) LogContains(s string) bool {
	b, err := os.ReadFile(p.LogPath)
	return err == nil && strings.Contains(string(b), s)
}
