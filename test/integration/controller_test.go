package integration

import (
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// startController runs the controller in process as the binary would,
// without leader election; configure adjusts the options. It is stopped
// when the test ends, or earlier by Stop.
func (e *env) startController(configure func(*app.Options)) *framework.Controller {
	e.t.Helper()
	return framework.StartControllerT(e.t, framework.ControllerOptions{
		Kubeconfig: e.kubeconfig,
		Logger:     ktesting.NewLogger(e.t, ktesting.NewConfig(ktesting.Verbosity(*controllerVerbosity))),
		Configure: func(o *app.Options) {
			o.LeaderElection.LeaderElect = false
			o.QPS, o.Burst = 100, 200
			// Tests stop the controller with attaches failing on purpose: a
			// short handoff keeps their stops quick. handoff_test.go sets its
			// own.
			o.HandoffTimeout = 2 * time.Second
			if configure != nil {
				configure(o)
			}
		},
	})
}

// assertRunning fails the test if the controller stopped by itself.
func assertRunning(t *testing.T, c *framework.Controller) {
	t.Helper()
	if !c.Running() {
		t.Fatalf("controller ended while the test still runs: %v", c.Err())
	}
}

// startAttacher runs a test external-attacher for driver until the test ends.
// Volumes whose handle starts with failPrefix (if not empty) fail to attach
// with framework.AttachFailureMessage(handle).
func (e *env) startAttacher(driver, failPrefix string) {
	e.t.Helper()
	framework.StartAttacher(e.t, e.client, framework.AttacherOptions{Drivers: []string{driver}, FailPrefix: failPrefix})
}
