package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat: 100
// on every Linux architecture the harness runs on.
const clockTicks = 100

// stopTimeout bounds a graceful stop before the process group is killed.
const stopTimeout = 15 * time.Second

// Proc is a controller under test, in its own process group, killed when
// the harness dies.
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	log     *os.File
	done    chan struct{}
	err     error
	// stopping is set by Stop: the exit that follows is no crash.
	stopping atomic.Bool
}

// StartProc starts binary with args, its output in logPath.
func StartProc(name, binary, logPath string, args ...string) (*Proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log of %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: logPath, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		log.Close()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// ExitError says how the process ended; call it after Done.
func (p *Proc) ExitError() error {
	if p.err == nil {
		return errors.New("exit status 0")
	}
	return p.err
}

// Stopped says whether Stop was called: an exit is then expected.
func (p *Proc) Stopped() bool { return p.stopping.Load() }

// Stop sends SIGTERM, waits up to stopTimeout, then kills the group.
func (p *Proc) Stop() {
	p.stopping.Store(true)
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// ProcStats is what /proc says of a process at one moment.
type ProcStats struct {
	At       time.Time
	CPUTicks int64 // utime + stime, in clockTicks
	RSSKiB   int64 // VmRSS
	HWMKiB   int64 // VmHWM: peak RSS so far
	Threads  int64
}

// CPUSeconds converts ticks to seconds.
func CPUSeconds(ticks int64) float64 { return float64(ticks) / clockTicks }

// Stats reads /proc/PID/stat and /proc/PID/status.
func (p *Proc) Stats() (ProcStats, error) {
	s := ProcStats{At: time.Now()}
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
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status of %s: %w", p.Name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
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
	return s, sc.Err()
}
