package integration

import (
	"context"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// controllerProc is one in-process run of the controller (app.Run).
type controllerProc struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startController runs the controller as the binary would, without leader
// election; configure adjusts the options. It is stopped when the test ends,
// or earlier by stop.
func (e *env) startController(configure func(*app.Options)) *controllerProc {
	e.t.Helper()
	o := app.NewOptions()
	o.Kubeconfig = e.kubeconfig
	o.LeaderElection.LeaderElect = false
	o.QPS, o.Burst = 100, 200
	// Tests stop the controller with attaches failing on purpose: a short
	// handoff keeps their stops quick. handoff_test.go sets its own.
	o.HandoffTimeout = 2 * time.Second
	if configure != nil {
		configure(o)
	}
	logger := ktesting.NewLogger(e.t, ktesting.NewConfig(ktesting.Verbosity(*controllerVerbosity)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	p := &controllerProc{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = app.Run(ctx, o)
	}()
	e.t.Cleanup(func() { p.stop(e.t) })
	return p
}

// stop cancels the controller and waits for Run to return, which must be
// without error. It may be called more than once.
func (p *controllerProc) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		t.Fatalf("controller Run did not return %s after its context was cancelled", stopTimeout)
	}
	if p.err != nil {
		t.Errorf("controller Run returned an error: %v", p.err)
		p.err = nil
	}
}

// running reports whether Run has not returned.
func (p *controllerProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// assertRunning fails the test if the controller stopped by itself.
func (p *controllerProc) assertRunning(t *testing.T) {
	t.Helper()
	if !p.running() {
		t.Fatalf("controller Run returned while the test still runs: %v", p.err)
	}
}

// startAttacher runs a test external-attacher for driver until the test ends.
// Volumes whose handle starts with failPrefix (if not empty) fail to attach
// with framework.AttachFailureMessage(handle).
func (e *env) startAttacher(driver, failPrefix string) {
	e.t.Helper()
	framework.StartAttacher(e.t, e.client, framework.AttacherOptions{Drivers: []string{driver}, FailPrefix: failPrefix})
}
