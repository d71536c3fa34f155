package process

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// start runs one replica with a short lease and its own HTTP endpoint.
func start(t *testing.T, lease string) *framework.Controller {
	t.Helper()
	return framework.StartControllerT(t, framework.ControllerOptions{
		Binary:     binary,
		Kubeconfig: cluster.Kubeconfig,
		HTTP:       true,
		Args:       append([]string{"--secure-port", "0", "-v", "2"}, leaseFlags(lease)...),
	})
}

// leaseFlags are the flags of a short lease named lease: a standby takes
// over seconds after the leader is gone.
func leaseFlags(lease string) []string {
	return []string{
		"--leader-elect-resource-name", lease,
		"--leader-elect-lease-duration", "4s",
		"--leader-elect-renew-deadline", "3s",
		"--leader-elect-retry-period", "500ms",
	}
}

func holder(ctx context.Context, lease string) (string, error) {
	l, err := cluster.Client.CoordinationV1().Leases("kube-system").Get(ctx, lease, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

func TestLeaderLifecycle(t *testing.T) {
	ctx := context.Background()
	const lease = "adc-lifecycle"
	p := start(t, lease)

	var leader string
	framework.Eventually(t, 60*time.Second, func() (bool, error) {
		h, err := holder(ctx, lease)
		leader = h
		return h != "" && strings.Contains(p.Output(), "Became leader"), err
	}, "the replica takes the lease")

	for _, path := range []string{"/healthz", "/readyz"} {
		framework.Eventually(t, 20*time.Second, func() (bool, error) {
			code, _, err := p.Get(ctx, path)
			return err == nil && code == http.StatusOK, nil
		}, "%s answers 200", path)
	}
	wantMetrics := []string{
		"go_goroutines",                         // Go runtime
		"process_cpu_seconds_total",             // process
		`rest_client_requests_total{code="200"`, // client-go requests
		`workqueue_adds_total{name="volumes"}`,  // named workqueues
		`workqueue_depth{name="nodestatus"}`,    // named workqueues
		"attachdetach_controller_volumes_waiting_for_node_info",
	}
	framework.Eventually(t, 20*time.Second, func() (bool, error) {
		code, body, err := p.Get(ctx, "/metrics")
		if err != nil || code != http.StatusOK {
			return false, nil
		}
		for _, m := range wantMetrics {
			if !strings.Contains(body, m) {
				t.Logf("metric %s not served yet", m)
				return false, nil
			}
		}
		return true, nil
	}, "/metrics serves runtime, client and workqueue metrics")

	// SIGTERM: stop, release the lease, exit 0 within a few seconds.
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	h, err := holder(ctx, lease)
	if err != nil {
		t.Fatal(err)
	}
	if h != "" {
		t.Fatalf("lease still held by %q after shutdown (was %q); want released", h, leader)
	}
}

func TestStandbyTakesOver(t *testing.T) {
	ctx := context.Background()
	const lease = "adc-takeover"
	first := start(t, lease)
	var firstID string
	framework.Eventually(t, 60*time.Second, func() (bool, error) {
		h, err := holder(ctx, lease)
		firstID = h
		return h != "" && strings.Contains(first.Output(), "Became leader"), err
	}, "the first replica leads")

	second := start(t, lease)
	framework.Eventually(t, 20*time.Second, func() (bool, error) {
		code, _, err := second.Get(ctx, "/healthz")
		return err == nil && code == http.StatusOK, nil
	}, "the standby answers /healthz")
	// The standby must not lead while the leader renews: watch a few lease
	// periods.
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		if h, err := holder(ctx, lease); err != nil || h != firstID {
			t.Fatalf("lease holder changed to %q (err %v) while the leader was alive", h, err)
		}
		if strings.Contains(second.Output(), "Became leader") {
			t.Fatalf("standby became leader while the leader was alive")
		}
		time.Sleep(500 * time.Millisecond)
	}

	first.Process.Kill() // SIGKILL: no release; the standby waits out the lease.
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		h, err := holder(ctx, lease)
		return h != "" && h != firstID && strings.Contains(second.Output(), "Became leader"), err
	}, "the standby takes over after the leader is killed")

	if err := second.Stop(10 * time.Second); err != nil {
		t.Fatalf("standby-turned-leader: %v", err)
	}
}

func TestFlagOutOfRange(t *testing.T) {
	for _, args := range [][]string{
		{"--workers", "0"},
		{"--attach-detach-reconcile-sync-period", "500ms"},
		{"--max-wait-for-unmount", "0s"},
		{"--kube-api-qps", "-1"},
	} {
		p := framework.StartControllerT(t, framework.ControllerOptions{Binary: binary, Kubeconfig: cluster.Kubeconfig, Args: args})
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: still running, want refused at start", args)
		}
		if code := p.Process.ExitCode(); code != 1 && code != 2 {
			t.Errorf("%v: exit code %d, want 1 or 2", args, code)
		}
		if !strings.Contains(p.Output(), args[0]) {
			t.Errorf("%v: message does not name the flag: %s", args, p.Output())
		}
	}
}
