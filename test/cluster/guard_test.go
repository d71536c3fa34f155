package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// guardDeadline is how soon after kube-controller-manager's first attach
// event the guard must report it.
const guardDeadline = 10 * time.Second

// TestGuardSeesHalfDoneCutOver: a cut-over left half done.
// kube-controller-manager is restarted with its attachdetach controller on
// (--controllers=*) while this controller runs, and a StatefulSet scales
// up: both controllers attach the same volumes to the same nodes and agree,
// so neither makes a write the other would not. The guard reports the other
// controller within guardDeadline of its first SuccessfulAttachVolume event,
// and the check every other test of this package ends with (guardQuiet)
// finds those reports: it is no check that cannot fail.
func TestGuardSeesHalfDoneCutOver(t *testing.T) {
	fullSet(t)
	e := startCluster(t, stack.Ours, stack.ClusterOptions{Nodes: 2})
	e.otherControllerExpected = true
	ns := e.namespace("guard")
	const name = "db"

	e.step("create with 1 replica, this controller alone", func(ctx context.Context) error {
		sts := stack.StatefulSet(ns, name, 1, e.c.StorageClass)
		if _, err := e.c.Client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, stepTimeout)
		return err
	})
	if reports, err := e.guardReports(e.ctx); err != nil || len(reports) != 0 {
		t.Fatalf("before kube-controller-manager's attachdetach runs: reports %q, err %v; want none", reports, err)
	}

	e.step("restart kube-controller-manager with --controllers=*", func(ctx context.Context) error {
		if err := e.c.ControllerManager.Stop(stack.StopGrace); err != nil {
			return err
		}
		p, err := e.c.StartControllerManager(ctx, stack.ControllerManagerOptions{AttachDetach: true})
		e.c.ControllerManager = p
		return err
	})

	// Scaled up, kube-controller-manager's attachdetach attaches beside
	// this controller: watched from then on, its first event and the
	// guard's first reports.
	if err := stack.ScaleStatefulSet(e.ctx, e.c.Client, ns, name, 3); err != nil {
		t.Fatal(err)
	}
	var firstEvent, seen time.Time
	var reports []string
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, stepTimeout, true, func(ctx context.Context) (bool, error) {
		var err error
		if firstEvent.IsZero() {
			if firstEvent, err = e.firstEventOf(ctx, "kube-controller-manager", "SuccessfulAttachVolume"); err != nil {
				return false, err
			}
		}
		if reports, err = e.guardReports(ctx); err != nil {
			return false, err
		}
		if seen.IsZero() && len(reports) > 0 {
			seen = time.Now()
		}
		return !firstEvent.IsZero() && !seen.IsZero(), nil
	})
	if err != nil {
		t.Fatalf("guard: reports %q, kube-controller-manager's first attach event at %s: %v", reports, firstEvent, err)
	}
	// Events carry whole seconds: the figure is an upper bound, up to a
	// second over.
	took := seen.Sub(firstEvent)
	t.Logf("timing guard reported kube-controller-manager's attachdetach %.1fs after its first attach event (written %s): %q", took.Seconds(), firstEvent.Format(time.RFC3339), reports)
	if took > guardDeadline {
		t.Errorf("guard reported %s after kube-controller-manager's first attach event, want within %s", took, guardDeadline)
	}
	if _, err := stack.WaitStatefulSetRunning(e.ctx, e.c.Client, ns, name, stepTimeout); err != nil {
		t.Fatal(err)
	}
	if n := len(e.watch.Violations()); n != 0 {
		t.Errorf("volumes on two nodes at once while both controllers ran: %q", e.watch.Violations())
	}
}

// firstEventOf returns when manager first wrote an event with reason, or
// the zero time if none is written yet.
func (e *env) firstEventOf(ctx context.Context, manager, reason string) (time.Time, error) {
	events, err := e.c.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + reason})
	if err != nil {
		return time.Time{}, fmt.Errorf("list %s events: %w", reason, err)
	}
	var first time.Time
	for _, ev := range events.Items {
		for _, f := range ev.ManagedFields {
			if f.Manager != manager || f.Time == nil {
				continue
			}
			if first.IsZero() || f.Time.Before(&metav1.Time{Time: first}) {
				first = f.Time.Time
			}
		}
	}
	return first, nil
}
