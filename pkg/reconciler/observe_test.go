package reconciler

import (
	"strings"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// TestObserve: a controller that does not act keeps the time a detach was
// first wanted, so that its decisions follow the max wait for unmount as
// Sync's do, and it acts on nothing.
func TestObserve(t *testing.T) {
	e := newEnv(t, Config{MaxWaitForUnmount: time.Minute})
	k := key(specA, node1)
	e.actual.SetNode(node1, cache.NodeInfo{Exists: true, Managed: true, Ready: false, Seen: true, InUse: map[volume.Name]bool{specA.Name: true}})
	e.actual.Update(k, true, func(a *cache.Attachment) {
		a.State, a.Kind, a.Spec, a.Reported = cache.Attached, specA.Kind, specA, true
	})
	e.desired.SetPod(podA, node1, []*volume.Spec{specA})

	o := e.r.Observe(k, t0, time.Time{})
	if o.Action != Nothing || o.Wait != "" {
		t.Fatalf("wanted and attached: %s, wait %q; want nothing", o.Decision, o.Wait)
	}

	// The pod goes: the max wait for unmount starts.
	e.desired.SetPod(podA, node1, nil)
	o = e.r.Observe(k, t0.Add(time.Second), time.Time{})
	if o.Action != Wait || !strings.Contains(o.Wait, "forced detach in 1m0s") || o.WaitAfter != time.Minute {
		t.Fatalf("unwanted, mounted on an unhealthy node: %s, wait %q after %s; want a wait of 1m", o.Decision, o.Wait, o.WaitAfter)
	}
	o = e.r.Observe(k, t0.Add(31*time.Second), time.Time{})
	if o.WaitAfter != 30*time.Second {
		t.Errorf("30s later: wait after %s, want 30s (the wait started at the first observation)", o.WaitAfter)
	}
	o = e.r.Observe(k, t0.Add(61*time.Second), time.Time{})
	if o.Action != Withdraw || o.Force != ForceTimeout || o.Wait != "" {
		t.Errorf("past the max wait: %s (force %q), wait %q; want a forced withdraw", o.Decision, o.Force, o.Wait)
	}

	// Gone from the actual state (someone else detached it): the wait is
	// counted from since.
	e.actual.Delete(k)
	o = e.r.Observe(k, t0.Add(2*time.Minute), t0.Add(90*time.Second))
	if o.Action != Nothing || o.WaitAfter != 30*time.Second {
		t.Errorf("detached by someone else 30s ago: %s, wait after %s; want nothing, and 30s left of the wait", o.Decision, o.WaitAfter)
	}
	if len(e.calls) != 0 || len(e.events()) != 0 {
		t.Errorf("Observe acted: calls %v", e.calls)
	}
}
