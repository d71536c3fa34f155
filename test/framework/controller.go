package framework

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) { return freePort() }

// Environment variables naming binaries built once for a whole test run (the
// Makefile sets them to its builds in _output/bin), so that each test package
// does not build and link its own copy. Unset, the tests build from source.
const (
	ControllerBinaryEnv = "ADC_CONTROLLER_BINARY"
	KubeletsimBinaryEnv = "ADC_KUBELETSIM_BINARY"
)

// PrebuiltBinary returns the binary that the environment variable env names,
// or "" if it is unset.
func PrebuiltBinary(env string) (string, error) {
	p := os.Getenv(env)
	if p == "" {
		return "", nil
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", env, p, err)
	}
	info, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%s: %w", env, err)
	}
	if info.IsDir() || info.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%s=%s is not an executable file", env, p)
	}
	return abs, nil
}

// BuildController builds the controller binary into dir and returns its path;
// if $ADC_CONTROLLER_BINARY is set, it returns that binary instead.
func BuildController(dir string) (string, error) {
	if bin, err := PrebuiltBinary(ControllerBinaryEnv); bin != "" || err != nil {
		return bin, err
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "attach-detach-controller")
	cmd := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app.Version=test",
		"./cmd/attach-detach-controller")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build controller: %w: %s", err, out)
	}
	return bin, nil
}

// Process is a program under test, killed with its test.
type Process struct {
	Cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// StartProcess starts binary with args; its combined output is kept (see
// Output) and echoed to the test log when the test fails. It is killed at
// the end of the test if still running.
func StartProcess(t testing.TB, binary string, args ...string) *Process {
	t.Helper()
	p := &Process{Cmd: exec.Command(binary, args...), done: make(chan struct{})}
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("pipe: %v", err)
	}
	p.Cmd.Stdout, p.Cmd.Stderr = w, w
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", binary, err)
	}
	w.Close()
	read := make(chan struct{})
	go func() {
		defer close(read)
		s := bufio.NewScanner(r)
		s.Buffer(make([]byte, 64*1024), 1024*1024)
		for s.Scan() {
			p.mu.Lock()
			p.out.WriteString(s.Text() + "\n")
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	go func() {
		p.err = p.Cmd.Wait()
		// Done means its output is all in Output too, unless a child of
		// its own still holds the pipe.
		select {
		case <-read:
		case <-time.After(5 * time.Second):
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("output of %s %s:\n%s", filepath.Base(binary), strings.Join(args, " "), p.Output())
		}
	})
	return p
}

// Output returns what the process printed so far.
func (p *Process) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Kill kills the process group and waits for the process.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Done is closed when the process has exited and its output is read.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitCode is the exit code, valid after Done.
func (p *Process) ExitCode() int { return p.Cmd.ProcessState.ExitCode() }
