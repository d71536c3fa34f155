package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const otherWriters = "attachdetach_controller_other_writer_objects"

// TestGuardSeesKubeControllerManager runs the real kube-controller-manager
// with its attachdetach controller beside this controller, as a cut-over
// that forgot --controllers=*,-attachdetach leaves it: this controller says
// so with a metric, a Warning event and a log line. Alone, it says nothing.
func TestGuardSeesKubeControllerManager(t *testing.T) {
	r := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, r)
	s := newScene(t, "guard", "")
	// A Lease long enough to survive being paused below.
	ours := startController(t, r, kubeconfig, []string{"--other-writer-check-period=1s",
		"--leader-elect-lease-duration=60s", "--leader-elect-renew-deadline=50s", "--leader-elect-retry-period=1s"})
	// Stopped with SIGTERM, so that it releases the Lease the next test's
	// controller takes (a kill would leave it held for 60s).
	defer stopController(t, ours)
	waitStarted(t, ours)

	// Alone: attaches and reports, and the guard stays quiet.
	one := s.volume("one", "handle-one")
	s.createPod(one)
	s.waitAttached(one)
	s.waitReported(one, true)
	framework.Consistently(t, 4*time.Second, func() error {
		m, err := framework.ScrapeMetrics(s.ctx, ours.HTTPURL+"/metrics")
		if err != nil {
			return err
		}
		if len(m.Select(otherWriters, nil)) == 0 {
			return fmt.Errorf("%s not served", otherWriters)
		}
		if n := m.Sum(otherWriters, nil); n != 0 {
			return fmt.Errorf("%s = %v with this controller alone, want 0", otherWriters, n)
		}
		return nil
	}, "no other writer while this controller runs alone")
	if strings.Contains(ours.Output(), "Another attach/detach controller") {
		t.Fatalf("the guard logs another controller while this one runs alone")
	}

	// kube-controller-manager's attachdetach controller starts beside it.
	// Two controllers writing the same content leave no trace (the API
	// server drops a write that changes nothing), so this one is paused
	// while a new pod comes: kube-controller-manager creates its
	// VolumeAttachment, as it does whenever it is first.
	// A spare volume: should a try find the VolumeAttachment written by
	// another than kube-controller-manager (this controller not stopped in
	// time), the next try uses it. kube-controller-manager resolves a pod's
	// claim from its initial list, so both claims are created first.
	tries := []volume{s.volume("two", "handle-two"), s.volume("spare", "handle-spare")}
	for _, v := range tries {
		s.createClaim(v)
	}
	kcm := startKubeControllerManager(t)
	defer kcm.stop(t)
	var two volume
	defer func() {
		if !t.Failed() {
			return
		}
		// Who wrote what, as the API server recorded it.
		for _, v := range tries {
			if va, err := s.attachment(v); err == nil && va != nil {
				for _, e := range va.ManagedFields {
					t.Logf("VolumeAttachment %s: manager %q %s subresource %q at %v: %s", va.Name, e.Manager, e.Operation, e.Subresource, e.Time, e.FieldsV1)
				}
			}
		}
		if node, err := s.client.CoreV1().Nodes().Get(s.ctx, s.node, metav1.GetOptions{}); err == nil {
			for _, e := range node.ManagedFields {
				t.Logf("Node %s: manager %q %s subresource %q at %v: %s", node.Name, e.Manager, e.Operation, e.Subresource, e.Time, e.FieldsV1)
			}
		}
		for _, l := range strings.Split(kcm.p.Output(), "\n") {
			if strings.Contains(l, "ttach") && !strings.Contains(l, "flags.go") {
				t.Logf("kube-controller-manager: %s", l)
			}
		}
	}()
	for i, v := range tries {
		if err := ours.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, ours.Process.Pid())
		s.startPod(v)
		// The API server's record of the write is the precondition of
		// what follows: kube-controller-manager wrote the spec.
		var writers []string
		framework.Eventually(t, 30*time.Second, func() (bool, error) {
			va, err := s.attachment(v)
			if va == nil || err != nil {
				return false, err
			}
			writers = nil
			for _, e := range va.ManagedFields {
				if e.Subresource == "" {
					writers = append(writers, e.Manager)
				}
			}
			return len(writers) > 0, nil
		}, "the VolumeAttachment of %s created", v.name)
		if err := ours.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if slices.Equal(writers, []string{"kube-controller-manager"}) {
			two = v
			break
		}
		if i == len(tries)-1 {
			t.Fatalf("VolumeAttachment of %s written by %v, not kube-controller-manager alone, on every try", v.name, writers)
		}
		t.Logf("VolumeAttachment of %s written by %v while this controller was stopped; trying again with %s", v.name, writers, tries[i+1].name)
	}
	s.waitAttached(two)
	s.waitReported(two, true)

	framework.Eventually(t, 60*time.Second, func() (bool, error) {
		m, err := framework.ScrapeMetrics(s.ctx, ours.HTTPURL+"/metrics")
		if err != nil {
			return false, nil
		}
		return m.Sum(otherWriters, nil) > 0, nil
	}, "%s > 0", otherWriters)
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		list, err := cluster.Client.CoreV1().Events("").List(s.ctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("reason", "AnotherAttachDetachController").String()})
		if err != nil {
			return false, err
		}
		for _, e := range list.Items {
			if e.Type == "Warning" && strings.Contains(e.Message, `"kube-controller-manager"`) {
				return true, nil
			}
		}
		return false, nil
	}, "a Warning event AnotherAttachDetachController naming kube-controller-manager")
	if out := ours.Output(); !strings.Contains(out, "Another attach/detach controller writes beside this one") ||
		!strings.Contains(out, "kube-controller-manager") {
		t.Errorf("no log line naming kube-controller-manager as another writer")
	}
}

// waitStopped waits until every thread of pid is stopped: a signal is
// delivered to each thread when it next runs, not when kill returns.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		stats, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(stats) == 0 {
			return false, err
		}
		for _, f := range stats {
			b, err := os.ReadFile(f)
			if err != nil {
				return false, nil
			}
			// pid (comm) state ...: comm may hold spaces, not ")".
			_, rest, _ := strings.Cut(string(b), ") ")
			if !strings.HasPrefix(rest, "T") && !strings.HasPrefix(rest, "t") {
				return false, nil
			}
		}
		return true, nil
	}, "process %d stopped", pid)
}
