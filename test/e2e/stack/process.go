package stack

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// killTimeout bounds the wait for a child after SIGKILL, which it cannot
// ignore: only a process stuck in the kernel takes longer.
const killTimeout = 30 * time.Second

// Process is one component of the stack, running in its own process group
// with its stdout and stderr in one log file in the stack's directory.
type Process struct {
	Name    string
	LogPath string

	cmd     *exec.Cmd
	logFile *os.File
	exited  chan struct{} // closed once the child is reaped
	waitErr error         // set before exited is closed

	stopOnce sync.Once
	stopErr  error
}

func startProcess(dir, name, binary string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own group: neither the terminal's Ctrl-C nor a signal to the
	// parent's group reaches it; the stack decides the order of shutdown.
	// Pdeathsig: the kernel kills it if the parent dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start %s: %w", name, err), logFile.Close())
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, logFile: logFile, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the process ID, also the ID of its process group.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the process has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitError says why the process exited, or is nil while it runs. A clean
// exit (code 0) is reported as an error too: components are not meant to
// exit on their own.
func (p *Process) ExitError() error {
	select {
	case <-p.exited:
		if p.waitErr != nil {
			return fmt.Errorf("%s exited: %w", p.Name, p.waitErr)
		}
		return fmt.Errorf("%s exited with code 0", p.Name)
	default:
		return nil
	}
}

// ExitCode is the exit code once exited, -1 if killed by a signal or still
// running.
func (p *Process) ExitCode() int {
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Terminate sends SIGTERM to the process alone, as a kubelet stopping a
// container does, and waits up to timeout for it to exit. It returns an
// error if it is still running then; it is not killed.
func (p *Process) Terminate(timeout time.Duration) error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.Name, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("%s (pid %d) still running %s after SIGTERM", p.Name, p.Pid(), timeout)
	}
}

// Kill sends SIGKILL to the process group and reaps the process.
func (p *Process) Kill() error {
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s process group %d: %w", p.Name, p.Pid(), err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("%s (pid %d) still running %s after SIGKILL", p.Name, p.Pid(), killTimeout)
	}
}

// stop ends the process: SIGTERM and up to grace to exit, then SIGKILL for
// it and whatever it started. It closes the log.
func (p *Process) stop(grace time.Duration) error {
	var errs []error
	if grace > 0 && p.ExitError() == nil {
		// A process that ignores SIGTERM is killed below; nothing to report.
		_ = p.Terminate(grace)
	}
	errs = append(errs, p.Kill())
	if err := p.logFile.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		errs = append(errs, fmt.Errorf("close log of %s: %w", p.Name, err))
	}
	return errors.Join(errs...)
}

// Tail returns up to the last n bytes of the process log, from a line start.
func (p *Process) Tail(n int64) string {
	data, err := framework.ReadTail(p.LogPath, n)
	if err != nil {
		return fmt.Sprintf("(cannot read log of %s: %s)", p.Name, err)
	}
	return data
}

// Log returns the whole process log.
func (p *Process) Log() string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log of %s: %s)", p.Name, err)
	}
	return string(data)
}
