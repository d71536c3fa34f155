package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"
)

const (
	// dirPrefix names the temp directories of clusters, so that Start can
	// find those left behind by a test binary that died.
	dirPrefix = "adc-cluster-"
	// ownerFile holds the pid of the test binary that owns a directory.
	ownerFile = "owner.pid"
	// tailBytes is how much of a child's log a start-up error shows.
	tailBytes = 4096
	// reapTimeout bounds the wait for a killed child; SIGKILL cannot be
	// ignored, so only a process stuck in the kernel takes longer.
	reapTimeout = 30 * time.Second
)

// Process is one child of a test, running in its own process group with
// its stdout and stderr in one log file. The kernel kills it if the test
// binary dies first (Pdeathsig). Every test package starts its programs
// with it: the cluster's etcd and kube-apiserver, the end-to-end stack, the
// benchmark's controllers, the controller binary under test (Controller), a
// test's other programs (StartProcess).
type Process struct {
	Name    string
	LogPath string
	Cmd     *exec.Cmd

	logFile *os.File
	exited  chan struct{} // closed once the child has been reaped
	waitErr error         // set before exited is closed

	// stopping is set by Terminate, Kill and Stop: the exit that follows
	// is no crash.
	stopping atomic.Bool
	closeLog sync.Once
}

// StartLogged starts binary with args in the directory of logPath, its
// output appended to logPath (so that the log of an attempt that lost a
// port race stays).
func StartLogged(name, logPath, binary string, args ...string) (*Process, error) {
	return start(name, logPath, filepath.Dir(logPath), nil, binary, args...)
}

// start is StartLogged in workDir ("": the test's), with env ("NAME=value")
// added to the environment.
func start(name, logPath, workDir string, env []string, binary string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir = workDir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group: Kill ends the child and whatever it started, and a
	// signal to the test's group (Ctrl-C) does not reach it: the test
	// decides the order of shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start %s: %w", name, err), logFile.Close())
	}
	p := &Process{Name: name, LogPath: logPath, Cmd: cmd, logFile: logFile, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// StartProcess starts binary with args for test t, in the test's working
// directory; its output goes to a log of its own (Output). It is killed at
// the end of the test if still running, and its log is echoed to the test
// log when the test fails.
func StartProcess(t testing.TB, binary string, args ...string) *Process {
	t.Helper()
	name := filepath.Base(binary)
	p, err := start(name, filepath.Join(t.TempDir(), name+".log"), "", nil, binary, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(0); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("output of %s %s:\n%s", name, strings.Join(args, " "), p.Output())
		}
	})
	return p
}

func startProcess(ctx context.Context, dir, name, binary string, args ...string) (*Process, error) {
	p, err := StartLogged(name, filepath.Join(dir, name+".log"), binary, args...)
	if err == nil {
		klog.FromContext(ctx).V(2).Info("Started process", "name", name, "pid", p.Pid(), "log", p.LogPath)
	}
	return p, err
}

// Pid is the process ID, also the ID of its process group.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.exited }

// ExitError says why the process exited, or is nil while it runs. A clean
// exit (code 0) is an error too: the programs under test are not meant to
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
		return p.Cmd.ProcessState.ExitCode()
	default:
		return -1
	}
}

// Stopped says whether Terminate, Kill or Stop was called: an exit is then
// expected.
func (p *Process) Stopped() bool { return p.stopping.Load() }

// Signal sends sig to the process alone.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Terminate sends SIGTERM to the process alone, as a kubelet stopping a
// container does, and waits up to timeout for it to exit. It returns an
// error if it is still running then; it is not killed.
func (p *Process) Terminate(timeout time.Duration) error {
	p.stopping.Store(true)
	if err := p.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
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
	p.stopping.Store(true)
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s process group %d: %w", p.Name, p.Pid(), err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(reapTimeout):
		return fmt.Errorf("%s (pid %d) still running %s after SIGKILL", p.Name, p.Pid(), reapTimeout)
	}
}

// Stop ends the process: SIGTERM and up to grace to exit (none with grace
// 0), then SIGKILL for it and whatever it started. It closes the log.
func (p *Process) Stop(grace time.Duration) error {
	p.stopping.Store(true)
	if grace > 0 && p.ExitError() == nil {
		// A process that ignores SIGTERM is killed below; nothing to report.
		_ = p.Terminate(grace)
	}
	errs := []error{p.Kill()}
	p.closeLog.Do(func() {
		if err := p.logFile.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close log of %s: %w", p.Name, err))
		}
	})
	return errors.Join(errs...)
}

// Tail returns up to the last n bytes of the process log, from a line start.
func (p *Process) Tail(n int64) string {
	data, err := ReadTail(p.LogPath, n)
	if err != nil {
		return fmt.Sprintf("(cannot read log of %s: %s)", p.Name, err)
	}
	return data
}

// Output returns the whole process log so far.
func (p *Process) Output() string {
	data, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(cannot read log of %s: %s)", p.Name, err)
	}
	return string(data)
}

// tail is the end of the log, for start-up errors.
func (p *Process) tail() string {
	return fmt.Sprintf("--- last lines of %s (%s):\n%s", p.Name, p.LogPath, p.Tail(tailBytes))
}

// lostPortRace tells whether the process failed because another process
// took a port between freePort and the bind.
func (p *Process) lostPortRace() bool {
	data, err := ReadTail(p.LogPath, 64*1024)
	return err == nil && strings.Contains(data, "address already in use")
}

// Stats is what /proc says of a process at one moment.
type Stats struct {
	At       time.Time
	CPUTicks int64 // utime + stime, in clockTicks
	RSSKiB   int64 // VmRSS
	HWMKiB   int64 // VmHWM: peak RSS so far
	Threads  int64
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100
// on every Linux architecture the tests run on.
const clockTicks = 100

// CPUSeconds converts ticks to seconds.
func CPUSeconds(ticks int64) float64 { return float64(ticks) / clockTicks }

// Stats reads /proc/PID/stat and /proc/PID/status.
func (p *Process) Stats() (Stats, error) {
	s := Stats{At: time.Now()}
	pid := p.Pid()
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read stat of %s: %w", p.Name, err)
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ')'. fields[0] is field 3 (state); utime and stime are
	// fields 14 and 15.
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return s, fmt.Errorf("parse stat of %s: %q", p.Name, stat)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return s, fmt.Errorf("parse stat of %s: %w", p.Name, err)
	}
	s.CPUTicks = utime + stime
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status of %s: %w", p.Name, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		switch key {
		case "VmRSS":
			s.RSSKiB = n
		case "VmHWM":
			s.HWMKiB = n
		case "Threads":
			s.Threads = n
		}
	}
	return s, nil
}

// ReadTail returns up to the last n bytes of the file at path, from the
// start of a line: the end of a process log.
func ReadTail(path string, n int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer func() { _ = f.Close() }() // read-only: a close error loses nothing
	info, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("stat %s: %w", path, err)
	}
	offset := max(info.Size()-n, 0)
	data, err := io.ReadAll(io.NewSectionReader(f, offset, info.Size()-offset))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if offset > 0 {
		// Start at a line boundary.
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			data = data[i+1:]
		}
	}
	return string(data), nil
}

// freePort returns a port that was free a moment ago. Another process may
// take it before the child binds it; callers retry on lostPortRace.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, fmt.Errorf("release port %d: %w", port, err)
	}
	return port, nil
}

// removeStaleDirs removes the temp directories of clusters whose test binary
// is gone: one that panicked or hit -timeout never ran Stop. Its children died
// with it (Pdeathsig); only the directory is left.
func removeStaleDirs(ctx context.Context) {
	logger := klog.FromContext(ctx)
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	if err != nil {
		logger.Error(err, "List stale cluster directories")
		return
	}
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			// Not ours, or an owner between MkdirTemp and writing the file.
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			logger.Error(err, "Remove stale cluster directory", "dir", dir)
			continue
		}
		logger.V(1).Info("Removed stale cluster directory", "dir", dir, "ownerPID", pid)
	}
}

// WaitFor polls cond every 100 ms until it reports done, returns an error,
// the process exits, ctx ends or timeout passes. A failure ends with the
// last lines of the process's log.
func (p *Process) WaitFor(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("not done after %s", timeout))
	defer cancel()
	var condErr error
	err := waitFor(ctx, p.ExitError, what, func(ctx context.Context) bool {
		done, err := cond(ctx)
		condErr = err
		return done || err != nil
	})
	if err == nil && condErr != nil {
		err = fmt.Errorf("wait for %s: %w", what, condErr)
	}
	if err != nil {
		return fmt.Errorf("%w\n--- last lines of %s:\n%s", err, p.LogPath, p.Tail(4096))
	}
	return nil
}

// waitFor polls check until it reports done, ended says the process has
// ended (Process.ExitError, Controller.Err), or ctx ends.
func waitFor(ctx context.Context, ended func() error, what string, check func(context.Context) bool) error {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		if check(ctx) {
			return nil
		}
		if err := ended(); err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, context.Cause(ctx))
		case <-ticker.C:
		}
	}
}
