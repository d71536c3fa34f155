package shadow

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// noMechanism fails the test on any call: Observe acts on nothing.
type noMechanism struct{ t *testing.T }

func (m noMechanism) Attach(context.Context, *volume.Spec, string) (reconciler.AttachResult, error) {
	m.t.Error("Observe attached")
	return reconciler.AttachResult{}, nil
}

func (m noMechanism) Detach(context.Context, cache.Attachment) (bool, error) {
	m.t.Error("Observe detached")
	return false, nil
}

func (m noMechanism) Settle(context.Context, cache.Attachment, *volume.Spec) (reconciler.Settled, error) {
	m.t.Error("Observe settled a detach")
	return reconciler.Settled{}, nil
}

// TestObserve: a controller that does not act keeps the time a detach was
// first wanted, so that its decisions follow the max wait for unmount as
// Sync's do, and it acts on nothing.
func TestObserve(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	spec := &volume.Spec{Name: volume.CSIName("d.example.com", "vol-a"), Kind: volume.KindCSI, Driver: "d.example.com",
		VolumeHandle: "vol-a", PVName: "pv-a", SingleNode: true}
	pod := cache.PodRef{Namespace: "default", Name: "pod-a", UID: "uid-a"}
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	status := nodestatus.NewRecord(actual)
	rec := record.NewFakeRecorder(10)
	r := reconciler.New(desired, actual, status, map[volume.Kind]reconciler.Mechanism{volume.KindCSI: noMechanism{t}}, rec, metrics.New(),
		reconciler.Config{MaxWaitForUnmount: time.Minute})
	k := cache.Key{Volume: spec.Name, Node: "node-1"}
	actual.SetNode("node-1", cache.NodeInfo{Exists: true, Managed: true, Ready: false, Seen: true, InUse: map[volume.Name]bool{spec.Name: true}}, time.Time{})
	actual.Update(k, true, func(a *cache.Attachment) {
		a.State, a.Kind, a.Spec = cache.Attached, spec.Kind, spec
	})
	status.Recover("node-1", []v1.AttachedVolume{{Name: v1.UniqueVolumeName(spec.Name)}})
	desired.SetPod(pod, "node-1", []*volume.Spec{spec})

	o := Observe(r, actual, k, t0, time.Time{})
	if o.Action != reconciler.Nothing || o.Wait != "" {
		t.Fatalf("wanted and attached: %s, wait %q; want nothing", o.Decision, o.Wait)
	}

	// The pod goes: the max wait for unmount starts.
	desired.SetPod(pod, "node-1", nil)
	o = Observe(r, actual, k, t0.Add(time.Second), time.Time{})
	if o.Action != reconciler.Wait || !strings.Contains(o.Wait, "forced detach in 1m0s") || o.WaitAfter != time.Minute {
		t.Fatalf("unwanted, mounted on an unhealthy node: %s, wait %q after %s; want a wait of 1m", o.Decision, o.Wait, o.WaitAfter)
	}
	o = Observe(r, actual, k, t0.Add(31*time.Second), time.Time{})
	if o.WaitAfter != 30*time.Second {
		t.Errorf("30s later: wait after %s, want 30s (the wait started at the first observation)", o.WaitAfter)
	}
	o = Observe(r, actual, k, t0.Add(61*time.Second), time.Time{})
	if o.Action != reconciler.Withdraw || o.Force != reconciler.ForceTimeout || o.Wait != "" {
		t.Errorf("past the max wait: %s (force %q), wait %q; want a forced withdraw", o.Decision, o.Force, o.Wait)
	}

	// Gone from the actual state (someone else detached it): the wait is
	// counted from since.
	actual.Delete(k)
	o = Observe(r, actual, k, t0.Add(2*time.Minute), t0.Add(90*time.Second))
	if o.Action != reconciler.Nothing || o.WaitAfter != 30*time.Second {
		t.Errorf("detached by someone else 30s ago: %s, wait after %s; want nothing, and 30s left of the wait", o.Decision, o.WaitAfter)
	}
	select {
	case ev := <-rec.Events:
		t.Errorf("Observe posted an event: %s", ev)
	default:
	}
}
