package framework

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
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

// ControllerName names the controller's process and log unless
// ControllerOptions.Name says otherwise.
const ControllerName = "attach-detach-controller"

// inProcessStopTimeout bounds the wait for Run to return when
// StartControllerT's cleanup stops a controller run in process.
const inProcessStopTimeout = 30 * time.Second

// ControllerOptions say how StartController runs the controller: in this
// process (app.Run) or as its binary, the same way for every test package.
type ControllerOptions struct {
	// Name names the controller in errors, and the binary's process;
	// default ControllerName.
	Name string
	// Kubeconfig is the cluster's: --kubeconfig of the binary, ahead of
	// Args (which may override it), or Options.Kubeconfig in process.
	Kubeconfig string
	// HTTP serves the plain HTTP endpoint (/metrics, /healthz, /readyz,
	// /explain) on a free loopback port: --http-endpoint after Args, or
	// Options.HTTPEndpoint in process. Controller.HTTPURL is its address.
	HTTP bool
	// Ready tells WaitReady whether the controller is ready; by default,
	// whether /readyz on the HTTP endpoint answers 200.
	Ready func(context.Context) bool

	// Binary is the controller binary (BuildController); empty runs the
	// controller in this process.
	Binary string
	// Args are the binary's flags; Env is added to its environment
	// ("NAME=value").
	Args []string
	Env  []string
	// LogPath is the file the binary's output is appended to; its directory
	// is the binary's working directory. StartControllerT puts one in the
	// test's temp directory.
	LogPath string

	// Configure adjusts the options of a controller run in process: those
	// of app.NewOptions with Kubeconfig and HTTP applied.
	Configure func(*app.Options)
	// Logger is the logger of a controller run in process; by default
	// StartController's context's, StartControllerT's test's.
	Logger klog.Logger
}

// Controller is one run of the controller under test, in this process or as
// its binary. Only Stop ends it.
type Controller struct {
	// Process is the binary's process, for its signals, exit code and log;
	// nil in process.
	Process *Process
	// HTTPURL is the base URL of the plain HTTP endpoint
	// (ControllerOptions.HTTP), or "".
	HTTPURL string

	name  string
	ready func(context.Context) bool
	done  <-chan struct{}

	// In process: cancel ends Run, whose error is runErr once done is
	// closed; stopping is set by Stop, reported once Stop has said how Run
	// ended (a binary's Process.Stopped says both).
	cancel   context.CancelFunc
	runErr   error
	stopping atomic.Bool
	reported atomic.Bool
}

// StartController starts the controller as o says and returns at once (see
// WaitReady). Its life is not bound to ctx: in process, Run has ctx's values
// (its logger) but only Stop cancels it.
func StartController(ctx context.Context, o ControllerOptions) (*Controller, error) {
	c := &Controller{name: cmp.Or(o.Name, ControllerName), ready: o.Ready}
	var endpoint string
	if o.HTTP {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		endpoint = "127.0.0.1:" + strconv.Itoa(port)
		c.HTTPURL = "http://" + endpoint
	}
	if o.Binary == "" {
		c.run(ctx, o, endpoint)
		return c, nil
	}
	if o.LogPath == "" {
		return nil, fmt.Errorf("start %s: no log path", c.name)
	}
	var args []string
	if o.Kubeconfig != "" {
		args = append(args, "--kubeconfig="+o.Kubeconfig)
	}
	args = append(args, o.Args...)
	if endpoint != "" {
		args = append(args, "--http-endpoint="+endpoint)
	}
	p, err := start(c.name, o.LogPath, filepath.Dir(o.LogPath), o.Env, o.Binary, args...)
	if err != nil {
		return nil, err
	}
	c.Process, c.done = p, p.Done()
	klog.FromContext(ctx).V(2).Info("Started controller", "name", c.name, "pid", p.Pid(), "log", p.LogPath)
	return c, nil
}

// run runs the controller in process, in a goroutine.
func (c *Controller) run(ctx context.Context, o ControllerOptions, endpoint string) {
	opts := app.NewOptions()
	opts.Kubeconfig = o.Kubeconfig
	if endpoint != "" {
		opts.HTTPEndpoint = endpoint
	}
	if o.Configure != nil {
		o.Configure(opts)
	}
	ctx = context.WithoutCancel(ctx)
	if o.Logger.GetSink() != nil {
		ctx = klog.NewContext(ctx, o.Logger)
	}
	ctx, c.cancel = context.WithCancel(ctx)
	done := make(chan struct{})
	c.done = done
	go func() {
		defer close(done)
		c.runErr = app.Run(ctx, opts)
	}()
}

// StartControllerT is StartController for test t, which it fails if the
// start fails. A controller still running when the test ends is stopped:
// in process as Stop does, its error failing the test; a binary is killed,
// as a test's other processes are, and its log is shown if the test failed.
func StartControllerT(t testing.TB, o ControllerOptions) *Controller {
	t.Helper()
	ctx := context.Background()
	if o.Binary == "" && o.Logger.GetSink() == nil {
		o.Logger, _ = ktesting.NewTestContext(t)
	}
	if o.Binary != "" && o.LogPath == "" {
		o.LogPath = filepath.Join(t.TempDir(), cmp.Or(o.Name, ControllerName)+".log")
	}
	c, err := StartController(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		grace := time.Duration(0)
		if c.Process == nil {
			grace = inProcessStopTimeout
		}
		if err := c.Stop(grace); err != nil {
			t.Error(err)
		}
		if c.Process != nil && t.Failed() {
			t.Logf("output of %s:\n%s", strings.Join(c.Process.Cmd.Args, " "), c.Output())
		}
	})
	return c
}

// Done is closed once the controller has ended.
func (c *Controller) Done() <-chan struct{} { return c.done }

// Running reports whether the controller has not ended.
func (c *Controller) Running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// Err is nil while the controller runs; once it has ended, it says how: the
// exit of the binary, or Run's return in process.
func (c *Controller) Err() error {
	if c.Process != nil {
		return c.Process.ExitError()
	}
	if c.Running() {
		return nil
	}
	if c.runErr != nil {
		return fmt.Errorf("%s: Run returned: %w", c.name, c.runErr)
	}
	return fmt.Errorf("%s: Run returned", c.name)
}

// Output is the binary's log so far; a controller run in process logs
// through its logger instead, and has none.
func (c *Controller) Output() string {
	if c.Process == nil {
		return ""
	}
	return c.Process.Output()
}

// Stop stops the controller and says whether it ended cleanly: it ended
// only when asked, in time, without an error. Later calls stop nothing more
// and do not repeat what the first said.
//
// In process, Stop cancels Run's context and waits up to grace for Run to
// return; a Run that has not returned by then is left running.
//
// A binary gets SIGTERM, as a kubelet stopping a container sends, and up to
// grace to exit with code 0; then it and whatever it started are killed.
// With grace 0 it is killed at once. How it ended is not judged then, nor
// when the test already asked for its end (Process.Kill, Terminate).
func (c *Controller) Stop(grace time.Duration) error {
	p := c.Process
	if p == nil {
		early := !c.stopping.Swap(true) && !c.Running()
		c.cancel()
		select {
		case <-c.done:
		case <-time.After(grace):
			return fmt.Errorf("%s: Run has not returned %s after its context was cancelled", c.name, grace)
		}
		switch {
		case c.reported.Swap(true):
			return nil
		case early:
			return fmt.Errorf("ended before it was stopped: %w", c.Err())
		case c.runErr != nil && !errors.Is(c.runErr, context.Canceled):
			return c.Err()
		}
		return nil
	}
	if grace == 0 || p.Stopped() {
		return p.Stop(grace)
	}
	if p.ExitError() != nil {
		return errors.Join(fmt.Errorf("ended before it was stopped: %w", c.Err()), p.Stop(0))
	}
	if err := errors.Join(p.Terminate(grace), p.Stop(0)); err != nil {
		return err
	}
	if p.ExitCode() != 0 {
		return c.Err()
	}
	return nil
}

// WaitReady waits up to timeout until the controller is ready
// (ControllerOptions.Ready); it fails at once if the controller ends.
func (c *Controller) WaitReady(ctx context.Context, timeout time.Duration) error {
	ready := c.ready
	if ready == nil {
		if c.HTTPURL == "" {
			return fmt.Errorf("wait for %s to be ready: it serves no HTTP endpoint to ask", c.name)
		}
		ready = func(ctx context.Context) bool {
			code, _, err := c.Get(ctx, "/readyz")
			return err == nil && code == http.StatusOK
		}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("not ready after %s", timeout))
	defer cancel()
	err := waitFor(ctx, c.Err, c.name+" to be ready", ready)
	if err != nil && c.Process != nil {
		err = fmt.Errorf("%w\n%s", err, c.Process.tail())
	}
	return err
}

// getTimeout bounds a request to the HTTP endpoint, so that a hung endpoint
// fails the poll that made it instead of outliving its deadline.
const getTimeout = 10 * time.Second

// Get fetches path from the plain HTTP endpoint: the status code and body.
func (c *Controller) Get(ctx context.Context, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, getTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.HTTPURL+path, nil)
	if err != nil {
		return 0, "", fmt.Errorf("request %s: %w", path, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("get %s%s: %w", c.HTTPURL, path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read fully below; nothing to lose
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", fmt.Errorf("read %s%s: %w", c.HTTPURL, path, err)
	}
	return resp.StatusCode, string(body), nil
}
