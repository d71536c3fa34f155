package reconciler

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestContinuesOperation(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	with := func(a cache.Attachment) (cache.Attachment, bool) { return a, true }
	for _, tc := range []struct {
		name   string
		action Action
		a      cache.Attachment
		has    bool
		want   bool
	}{
		{"nothing to do", Nothing, cache.Attachment{}, false, true},
		{"new attach", Attach, cache.Attachment{}, false, false},
		{"attach started before", Attach, cache.Attachment{State: cache.Uncertain}, true, true},
		{"withdraw of an attached volume", Withdraw, cache.Attachment{State: cache.Attached}, true, false},
		{"withdraw of an attach never confirmed", Withdraw, cache.Attachment{State: cache.Uncertain}, true, true},
		{"detach of an attached volume", Detach, cache.Attachment{State: cache.Attached, Withdrawn: true}, true, false},
		{"detach that began and failed", Detach, cache.Attachment{State: cache.Attached, Withdrawn: true, DetachStarted: t0}, true, true},
		{"detach under way", Detach, cache.Attachment{State: cache.Detaching, DetachStarted: t0}, true, true},
		{"detach of an attach never confirmed", Detach, cache.Attachment{State: cache.Uncertain}, true, true},
		{"wait for unmount", Wait, cache.Attachment{State: cache.Attached}, true, false},
		{"wait before the detach of an attach never confirmed", Wait, cache.Attachment{State: cache.Uncertain}, true, true},
		{"wait to finish a detach that began and failed", Wait, cache.Attachment{State: cache.Attached, Withdrawn: true, DetachStarted: t0}, true, true},
		{"blocked", Blocked, cache.Attachment{}, false, false},
		{"settle a detach that began, for a pod that wants the volume again", Settle, cache.Attachment{State: cache.Attached, Withdrawn: true, DetachStarted: t0}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decision{Action: tc.action}
			if tc.has {
				d.Attachment, d.HasAttachment = with(tc.a)
			}
			if got := handoffContinues(d); got != tc.want {
				t.Errorf("handoffContinues(%s of %+v) = %v, want %v", tc.action, tc.a, got, tc.want)
			}
		})
	}
}

// countingMechanism attaches at once and counts its calls.
type countingMechanism struct{ attaches, detaches int }

func (m *countingMechanism) Attach(context.Context, *volume.Spec, string) (AttachResult, error) {
	m.attaches++
	return AttachResult{}, nil
}

func (m *countingMechanism) Detach(context.Context, cache.Attachment) (bool, error) {
	m.detaches++
	return true, nil
}

func (m *countingMechanism) Settle(context.Context, cache.Attachment, *volume.Spec) (Settled, error) {
	return Settled{Detached: true}, nil
}

// A handoff while pods remain to be read: an attach this controller started,
// whose object it never saw, of a volume no pod read so far wants, is
// finished (it may be wanted by a pod not read yet, and nothing may be
// detached), so that the handoff can end; outside a handoff it waits. An
// attachment it did not start, whose object it saw, or of a ReadWriteOnce
// volume held elsewhere, waits even then.
func TestHandoffFinishesAnUnconfirmedAttachWhilePodsAreRead(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		started   time.Time
		uid       string
		elsewhere bool
		finished  bool
	}{
		{name: "started here, object never seen", started: t0, finished: true},
		{name: "recovered, not started here"},
		{name: "its object seen", started: t0, uid: "uid-1"},
		{name: "ReadWriteOnce, held on another node", started: t0, elsewhere: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			actual.SetNode(node1, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
			actual.SetNode(node2, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
			k := key(specA, node1)
			actual.Update(k, true, func(a *cache.Attachment) {
				a.State, a.Kind, a.Spec, a.AttachError = cache.Uncertain, specA.Kind, specA, "create failed"
				a.AttachStarted, a.AttachmentUID = tc.started, tc.uid
			})
			if tc.elsewhere {
				actual.Update(key(specA, node2), true, func(a *cache.Attachment) { a.State, a.Kind = cache.Attached, specA.Kind })
			}
			desired.SetPartial(true)
			m := &countingMechanism{}
			status := nodestatus.NewRecord(actual)
			r := New(desired, actual, status, map[volume.Kind]Mechanism{volume.KindCSI: m}, record.NewFakeRecorder(10), metrics.New(),
				Config{MaxWaitForUnmount: time.Minute})
			if _, err := r.Sync(ctx, k); err != nil {
				t.Fatal(err)
			}
			if m.attaches != 0 || m.detaches != 0 {
				t.Fatalf("before a handoff: %d attaches, %d detaches; want none (it waits for the pods)", m.attaches, m.detaches)
			}
			status.HandOver()
			if _, err := r.Sync(ctx, k); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.finished]; m.attaches != want || m.detaches != 0 {
				t.Errorf("during a handoff: %d attaches, %d detaches; want %d, none", m.attaches, m.detaches, want)
			}
		})
	}
}

// A detach that began and failed, whose next try must wait (its node went
// NotReady with the volume mounted: the max wait for unmount), is finished
// during a handoff once it may: the wait is woken, not dropped, so that the
// handoff is not held by a detach under way that nothing would end.
func TestHandoffFinishesADetachThatBeganOnceItMay(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	_, ctx := ktesting.NewTestContext(t)
	clk := clocktesting.NewFakePassiveClock(t0)
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	actual.SetNode(node1, cache.NodeInfo{Managed: true, InUse: map[volume.Name]bool{specA.Name: true}}, time.Time{})
	k := key(specA, node1)
	actual.Update(k, true, func(a *cache.Attachment) {
		a.State, a.Kind, a.Spec = cache.Attached, specA.Kind, specA
		// Its VolumeAttachment is seen: there is something to detach.
		a.AttachmentName, a.AttachmentUID = vaNameA, "uid-va"
		a.Withdrawn, a.DetachWanted, a.DetachStarted, a.DetachError = true, t0, t0, "timeout"
	})
	m := &countingMechanism{}
	status := nodestatus.NewRecord(actual)
	r := New(desired, actual, status, map[volume.Kind]Mechanism{volume.KindCSI: m}, record.NewFakeRecorder(10), metrics.New(),
		Config{MaxWaitForUnmount: time.Minute, Clock: clk})
	status.HandOver()
	res, err := r.Sync(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if m.detaches != 0 || res.RequeueAfter <= 0 {
		t.Fatalf("within the max wait: %d detaches, synced again after %v; want none, after the wait", m.detaches, res.RequeueAfter)
	}
	clk.SetTime(t0.Add(time.Minute))
	if _, err := r.Sync(ctx, k); err != nil {
		t.Fatal(err)
	}
	if m.detaches != 1 {
		t.Errorf("after the max wait: %d detaches, want 1", m.detaches)
	}
}
