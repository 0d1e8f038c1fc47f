package localcluster

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a child process. Its output goes to a log file, whose last
// lines Tail returns, so a failure can show what the binary said.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	mu      sync.Mutex
	exitErr error
}

// StartProcess starts bin with args, writing its output to logPath. The
// process runs in an empty directory beside its log, so relative paths in
// args do not resolve against the caller's working directory. The
// process gets its own process group so that it and any children are killed
// together, and it dies with its parent.
func StartProcess(name, logPath, bin string, args ...string) (*Process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log for %s: %w", name, err)
	}
	// Run in an empty directory of its own, never the caller's: kubelet,
	// for one, deletes the files matching "<log path>*" relative to its
	// working directory when it removes a container whose runtime reported
	// no log path — "*" would be the caller's sources.
	dir := logPath + ".cwd"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("working directory for %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
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
	return p, nil
}

// Stop sends SIGTERM to the process group, then SIGKILL after 10 seconds.
// It is safe to call more than once.
func (p *Process) Stop() {
	if !p.signal(syscall.SIGTERM) {
		return
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}

// Kill stops the process at once with SIGKILL, as a crash would.
func (p *Process) Kill() {
	if p.signal(syscall.SIGKILL) {
		<-p.done
	}
}

// signal sends sig to the process group unless the process has ended,
// and reports whether it did.
func (p *Process) signal(sig syscall.Signal) bool {
	select {
	case <-p.done:
		return false
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
	return true
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
