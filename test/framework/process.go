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
	"syscall"
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

// process is one child of the test binary, running in its own process group
// with its stdout and stderr in one log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	exited  chan struct{} // closed once the child has been reaped
	waitErr error         // set before exited is closed
}

func startProcess(ctx context.Context, dir, name, binary string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	// Append, so that the log of an attempt that lost a port race stays.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	// Own process group: Stop kills the whole group. Pdeathsig: the kernel
	// kills the child when the test binary dies without running Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start %s: %w", name, err), logFile.Close())
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	klog.FromContext(ctx).V(2).Info("Started process", "name", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exitError returns why the process has exited, or nil while it runs.
func (p *process) exitError() error {
	select {
	case <-p.exited:
		if p.waitErr != nil {
			return fmt.Errorf("%s exited: %w", p.name, p.waitErr)
		}
		return fmt.Errorf("%s exited", p.name)
	default:
		return nil
	}
}

// stop kills the process group and reaps the child. The cluster's state is
// thrown away, so there is nothing a graceful shutdown would save.
func (p *process) stop() error {
	var errs []error
	if err := syscall.Kill(-p.pid(), syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		errs = append(errs, fmt.Errorf("kill %s process group %d: %w", p.name, p.pid(), err))
	}
	select {
	case <-p.exited:
	case <-time.After(reapTimeout):
		errs = append(errs, fmt.Errorf("%s (pid %d) still running %s after SIGKILL", p.name, p.pid(), reapTimeout))
	}
	if err := p.logFile.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close log of %s: %w", p.name, err))
	}
	return errors.Join(errs...)
}

// tail returns the end of the process log, for start-up errors.
func (p *process) tail() string {
	data, err := ReadTail(p.logPath, tailBytes)
	if err != nil {
		return fmt.Sprintf("--- %s: cannot read log: %s", p.name, err)
	}
	return fmt.Sprintf("--- last lines of %s (%s):\n%s", p.name, p.logPath, data)
}

// lostPortRace tells whether the process failed because another process
// took a port between freePort and the bind.
func (p *process) lostPortRace() bool {
	data, err := ReadTail(p.logPath, 64*1024)
	return err == nil && strings.Contains(data, "address already in use")
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

// waitFor polls check until it reports done, the process exits, or ctx ends.
func waitFor(ctx context.Context, p *process, what string, check func(context.Context) bool) error {
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		if check(ctx) {
			return nil
		}
		if err := p.exitError(); err != nil {
			return fmt.Errorf("wait for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, context.Cause(ctx))
		case <-ticker.C:
		}
	}
}
