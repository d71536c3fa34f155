package framework

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
)

// shell runs script with /bin/sh as the controller binary: a stand-in whose
// exit Stop judges.
func shell(t *testing.T, script string, env ...string) *Controller {
	t.Helper()
	return StartControllerT(t, ControllerOptions{Binary: "/bin/sh", Args: []string{"-c", script}, Env: env})
}

// Stop judges how a binary ended: only when asked, in time, with code 0.
func TestControllerStopJudgesTheExit(t *testing.T) {
	const (
		// loop says the trap is set, then keeps the shell waiting; the trap
		// runs between sleeps.
		loop  = "echo trapped; while :; do sleep 0.05; done"
		grace = 5 * time.Second
	)
	for _, tc := range []struct {
		name, script string
		grace        time.Duration
		// ended waits for the end before Stop.
		ended bool
		want  string // in Stop's error; "" for none
	}{
		{name: "exit 0 on SIGTERM", script: "trap 'exit 0' TERM; " + loop, grace: grace},
		{name: "exit 3 on SIGTERM", script: "trap 'exit 3' TERM; " + loop, grace: grace, want: "exit status 3"},
		{name: "SIGTERM ignored", script: "trap '' TERM; " + loop, grace: 300 * time.Millisecond, want: "still running 300ms after SIGTERM"},
		{name: "ended before Stop", script: "exit 0", grace: grace, ended: true, want: "ended before it was stopped"},
		{name: "killed at once", script: "trap '' TERM; " + loop, grace: 0},
		{name: "ended before a kill", script: "exit 1", grace: 0, ended: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := shell(t, tc.script)
			if tc.ended {
				select {
				case <-c.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the shell did not exit")
				}
			} else {
				Eventually(t, 10*time.Second, func() (bool, error) {
					return strings.Contains(c.Output(), "trapped"), c.Err()
				}, "the shell to set its trap")
			}
			err := c.Stop(tc.grace)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Stop: %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Stop: %v, want an error with %q", err, tc.want)
			}
			if c.Running() {
				t.Errorf("still running after Stop")
			}
			if err := c.Stop(tc.grace); err != nil {
				t.Errorf("second Stop: %v, want no error: the first said it", err)
			}
		})
	}
}

// The binary gets Env, and WaitReady gives up at once, with its log, when it
// exits.
func TestControllerBinaryEnvAndEarlyExit(t *testing.T) {
	c := shell(t, `echo "said $GREETING"; exit 2`, "GREETING=hello")
	c.ready = func(context.Context) bool { return false }
	start := time.Now()
	err := c.WaitReady(t.Context(), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exit status 2") || !strings.Contains(err.Error(), "said hello") {
		t.Errorf("WaitReady: %v, want the exit status and the log", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("WaitReady took %s after the exit", took)
	}
	if err := c.Stop(time.Second); err == nil {
		t.Errorf("Stop: no error for a controller that ended before it was stopped")
	}
}

// A controller run in process whose Run fails: WaitReady says so at once,
// Stop reports Run's error.
func TestControllerInProcessRunFails(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing-kubeconfig")
	c := StartControllerT(t, ControllerOptions{Kubeconfig: missing, HTTP: true})
	if err := c.WaitReady(t.Context(), time.Minute); err == nil || !strings.Contains(err.Error(), "Run returned") {
		t.Errorf("WaitReady: %v, want Run's error", err)
	}
	err := c.Stop(time.Minute)
	if err == nil || !strings.Contains(err.Error(), "ended before it was stopped") || !strings.Contains(err.Error(), missing) {
		t.Errorf("Stop: %v, want Run's error about %s", err, missing)
	}
}

// The same controller, in process and as its binary, against a real
// cluster: ready, serving its HTTP endpoint, stopped cleanly.
func TestControllerInProcessAndBinary(t *testing.T) {
	cluster := StartT(t)
	binary, err := BuildController(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		o    ControllerOptions
	}{
		{"in process", ControllerOptions{Configure: func(o *app.Options) { o.LeaderElection.LeaderElect = false }}},
		{"binary", ControllerOptions{Binary: binary, Args: []string{"--leader-elect=false", "--secure-port=0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Kubeconfig = cluster.Kubeconfig
			tc.o.HTTP = true
			c := StartControllerT(t, tc.o)
			if err := c.WaitReady(t.Context(), time.Minute); err != nil {
				t.Fatal(err)
			}
			code, body, err := c.Get(t.Context(), "/metrics")
			if err != nil || code != http.StatusOK || !strings.Contains(body, "workqueue_depth") {
				t.Errorf("/metrics: %d, %v, want 200 with workqueue metrics", code, err)
			}
			if tc.o.Binary != "" && !strings.Contains(c.Output(), "Starting attach-detach-controller") {
				t.Errorf("the binary's log does not show its start:\n%s", c.Output())
			}
			if err := c.Stop(30 * time.Second); err != nil {
				t.Errorf("Stop: %v", err)
			}
			if c.Running() {
				t.Errorf("still running after Stop")
			}
		})
	}
}
