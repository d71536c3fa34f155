package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestRecover(t *testing.T) {
	pv := csiPV("claim-a", "h1")
	vaName := volume.AttachmentName("h1", driver, "node-1")
	for _, tc := range []struct {
		name    string
		objects []runtime.Object

		// wantActual and wantDesired: the state Recover rebuilds, before any
		// worker runs.
		wantActual, wantDesired []string
		// wantWrites: the API writes the workers make once they run.
		wantWrites []string
	}{
		{
			name: "attachments rebuilt from VolumeAttachments and node status, desired state from pods; nothing detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1"), iscsiName), inUse(csiName("h1"), iscsiName)),
				pv, claim("claim-a"), va("claim-a", "h1", "node-1"), pod("pod-a", "node-1", "claim-a"),
			},
			wantActual:  []string{csiName("h1") + "@node-1 attached reported", iscsiName + "@node-1 attached reported"},
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
		},
		{
			name: "volume a pod still wants, not mounted: kept (and reported)",
			objects: []runtime.Object{
				node("node-1"), pv, claim("claim-a"), va("claim-a", "h1", "node-1"), pod("pod-a", "node-1", "claim-a"),
			},
			wantActual:  []string{csiName("h1") + "@node-1 attached"},
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantWrites:  []string{"patch nodes/status node-1"},
		},
		{
			name:       "orphan VolumeAttachment (attached, managed Ready node, wanted by no pod, not mounted): detached",
			objects:    []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1")},
			wantActual: []string{csiName("h1") + "@node-1 attached"},
			wantWrites: []string{"delete volumeattachments " + vaName},
		},
		{
			name: "orphan listed in node status: withdrawn from the report first, then detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1"))), pv, va("claim-a", "h1", "node-1"),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached reported"},
			wantWrites: []string{"patch nodes/status node-1", "delete volumeattachments " + vaName},
		},
		{
			name: "orphan the node lists in use: nothing detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1")), inUse(csiName("h1"))), pv, va("claim-a", "h1", "node-1"),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached reported"},
		},
		{
			name: "orphan on a node the controller does not manage: not detached",
			objects: []runtime.Object{
				node("node-1", unmanaged), pv, va("claim-a", "h1", "node-1"),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached"},
			// Reported as attached, as upstream reports what it recovers.
			wantWrites: []string{"patch nodes/status node-1"},
		},
		{
			name: "volume of a terminated pod, not mounted: detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1"))), pv, claim("claim-a"), va("claim-a", "h1", "node-1"),
				withPod(pod("pod-a", "node-1", "claim-a"), deleting, containersStopped),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached reported"},
			wantWrites: []string{"patch nodes/status node-1", "delete volumeattachments " + vaName},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects...)
			if err := f.c.Recover(f.ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			checkList(t, "actual state after Recover", f.actualState(), tc.wantActual)
			checkList(t, "desired state after Recover", f.desiredState(), tc.wantDesired)
			checkList(t, "API writes of Recover", f.writes(), nil)
			f.drain()
			checkList(t, "API writes of the workers", f.writes(), tc.wantWrites)
		})
		// As Run recovers: the volume keys held back, then fed to the
		// queue; the same state and, once every key had its look, the
		// same writes.
		t.Run(tc.name+", paced", func(t *testing.T) {
			f := newFixture(t, tc.objects...)
			held, err := f.c.RecoverHeld(f.ctx)
			if err != nil {
				t.Fatalf("RecoverHeld: %v", err)
			}
			checkList(t, "actual state after RecoverHeld", f.actualState(), tc.wantActual)
			checkList(t, "desired state after RecoverHeld", f.desiredState(), tc.wantDesired)
			// Queued at once: only a volume a pod wants that is not
			// attached yet (or withdrawn, or wanted detached).
			pending := f.volumes.pending()
			for _, k := range pending {
				if a, ok := f.c.actual.Get(k); !f.c.desired.Wanted(k) || (ok && a.State == cache.Attached && !a.Withdrawn && a.DetachWanted.IsZero()) {
					t.Errorf("volume key %v queued by RecoverHeld, want it held back", k)
				}
			}
			if len(tc.wantWrites) > 0 && len(held) == 0 {
				t.Fatal("RecoverHeld held back no key, and the workers have writes to make")
			}
			feedRecovered(f.ctx, f.volumes, held, len(held)+len(pending), nil)
			f.drain()
			checkList(t, "API writes of the workers", f.writes(), tc.wantWrites)
		})
	}
}

// While a restart reads the pods, the workers run: a pod created meanwhile
// has its volume attached, and a volume whose pod is not read yet, or that
// no pod wants, is neither withdrawn nor detached until every pod is read.
func TestRecoveryReadsPodsWhileWorkersRun(t *testing.T) {
	ck := func(h string) cache.Key { return cache.Key{Volume: volume.CSIName(driver, h), Node: "node-1"} }
	kept, orphan, fresh := ck("h1"), ck("h2"), ck("h3")
	objs := []runtime.Object{
		// Listed, not mounted: nothing but the unread pod keeps h1 attached.
		node("node-1", listsAttached(csiName("h1"), csiName("h2"))),
		csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "node-1"), pod("pod-a", "node-1", "claim-a"),
		csiPV("claim-b", "h2"), va("claim-b", "h2", "node-1"),
		// Created while the controller was down.
		csiPV("claim-d", "h4"), claim("claim-d"), pod("pod-d", "node-1", "claim-d"),
	}
	f := newFixture(t, objs...)
	r, err := f.c.BeginRecovery(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if q := f.queued(QueuePods); len(q) != 0 {
		t.Errorf("pods queued by the rebuild of the actual state: %v, want none (every pod is read after)", q)
	}
	// Before any pod is read: a pod is created, its event processed.
	objs = append(objs, csiPV("claim-c", "h3"), claim("claim-c"), pod("pod-c", "node-1", "claim-c"))
	f.load(objs...)
	if err := f.c.syncPod(f.ctx, "default/pod-c"); err != nil {
		t.Fatal(err)
	}
	for _, k := range []cache.Key{kept, orphan} {
		f.volumes.Add(k)
	}
	f.drain()
	checkList(t, "API writes while pods are read", f.writes(), []string{
		"create volumeattachments " + volume.AttachmentName("h3", driver, "node-1")})
	for _, k := range []cache.Key{kept, orphan} {
		a, _ := f.c.actual.Get(k)
		if a.Withdrawn || !a.DetachWanted.IsZero() {
			t.Errorf("%v while pods are read: withdrawn %v, detach wanted since %v; want neither", k, a.Withdrawn, a.DetachWanted)
		}
		if d := f.c.reconciler.Decide(k, epoch); d.Action != "wait" || !strings.Contains(d.Reason, "reading every pod") {
			t.Errorf("%v while pods are read: %v, want a wait for the pods", k, d)
		}
	}
	// Its VolumeAttachment, as the informer delivers it.
	f.load(append(objs, va("claim-c", "h3", "node-1", notAttached))...)
	if err := f.c.syncAttachment(f.ctx, volume.AttachmentName("h3", driver, "node-1")); err != nil {
		t.Fatal(err)
	}
	f.reset()
	for more := true; more; {
		if more, err = r.Step(f.ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	// Read, the pod created while the controller was down has its volume
	// queued at once; the others wait for Finish.
	if got := f.volumes.pending(); fmt.Sprint(got) != fmt.Sprint([]cache.Key{ck("h4")}) {
		t.Errorf("volume keys queued as the pods are read: %v, want only %v", got, ck("h4"))
	}
	f.drain()
	checkList(t, "API writes as the pods are read", f.writes(), []string{
		"create volumeattachments " + volume.AttachmentName("h4", driver, "node-1")})
	f.load(append(objs, va("claim-c", "h3", "node-1", notAttached), va("claim-d", "h4", "node-1", notAttached))...)
	if err := f.c.syncAttachment(f.ctx, volume.AttachmentName("h4", driver, "node-1")); err != nil {
		t.Fatal(err)
	}
	f.reset()
	held := r.Finish(f.ctx)
	if !slices.Contains(held, fresh) || !slices.Contains(held, kept) || !slices.Contains(held, orphan) {
		t.Errorf("keys for a look after the pods: %v, want %v, %v and %v among them", held, kept, orphan, fresh)
	}
	feedRecovered(f.ctx, f.volumes, held, len(held), nil)
	f.drain()
	checkList(t, "API writes once every pod is read", f.writes(), []string{
		"patch nodes/status node-1", "delete volumeattachments " + volume.AttachmentName("h2", driver, "node-1")})
}

// Run's reading of the pods stops when it is asked to (a graceful stop:
// the handoff follows), and processes a bounded part of the pod queue
// between two steps: a flood of pod events does not hold the reading.
func TestReadPodsStopsAndBoundsThePodQueue(t *testing.T) {
	objs := []runtime.Object{node("node-1"), csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a")}
	f := newFixture(t, objs...)
	r, err := f.c.BeginRecovery(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	close(stop)
	if stopped, err := f.c.readPods(f.ctx, stop, r); !stopped || err != nil {
		t.Fatalf("readPods with stop closed: %v, %v; want stopped", stopped, err)
	}
	if got := f.desiredState(); len(got) != 0 {
		t.Errorf("desired state after a stop before any step: %v, want nothing read", got)
	}
	const events = 3 * recoveryStep
	for i := range events {
		f.queues[QueuePods].Add(fmt.Sprintf("default/gone-%d", i))
	}
	if stopped, err := f.c.readPods(f.ctx, nil, r); stopped || err != nil {
		t.Fatalf("readPods: %v, %v; want every pod read", stopped, err)
	}
	checkList(t, "desired state", f.desiredState(), []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"})
	if left := f.queues[QueuePods].Len(); left != events-recoveryStep {
		t.Errorf("pod events left for the workers: %d, want %d (one step's worth processed)", left, events-recoveryStep)
	}
}

// Recover reads the newest pods first (created while the controller was
// down or starting: the likeliest to need an attach), then in name order,
// whatever the order of the lister: a restart does the same things in the
// same order (here, the warnings).
func TestRecoverReadsPodsInOrder(t *testing.T) {
	objs := []runtime.Object{node("node-1")}
	var want []string
	for _, i := range []int{5, 2, 0, 1, 3, 4, 6, 7} {
		name := fmt.Sprintf("pod-%d", i)
		p := pod(name, "node-1", "claim-"+name)
		switch i {
		case 5:
			p.CreationTimestamp = metav1.NewTime(epoch.Add(2 * time.Minute))
		case 2:
			p.CreationTimestamp = metav1.NewTime(epoch.Add(time.Minute))
		default:
			p.CreationTimestamp = metav1.NewTime(epoch)
		}
		objs = append(objs, p)
		want = append(want, fmt.Sprintf(`PersistentVolumeClaim "default/claim-%s" not found`, name))
	}
	f := newFixture(t, objs...)
	// Every claim has been missing longer than the grace.
	f.clock.Step(2*time.Minute + claimGrace)
	if err := f.c.Recover(f.ctx); err != nil {
		t.Fatal(err)
	}
	got := f.takeEvents()
	if len(got) != len(want) {
		t.Fatalf("events %q, want one warning per pod", got)
	}
	for i := range want {
		if !strings.HasSuffix(got[i], want[i]) {
			t.Errorf("event %d: %q, want the warning ending %q", i, got[i], want[i])
		}
	}
}

// After a restart the keys with something to do are fed first: a volume a
// pod created while the controller was down wants, and an orphan; the
// settled ones (wanted, attached, in node status) after them, every one
// still fed.
func TestRecoverHeldFeedsSettledLast(t *testing.T) {
	var objs []runtime.Object
	var listed []string
	settled := map[cache.Key]bool{}
	for i := range 6 {
		h, c := fmt.Sprintf("h%d", i), fmt.Sprintf("claim-%d", i)
		objs = append(objs, csiPV(c, h), claim(c), va(c, h, "node-1"), pod("pod-"+c, "node-1", c))
		listed = append(listed, csiName(h))
		settled[cache.Key{Volume: volume.Name(csiName(h)), Node: "node-1"}] = true
	}
	objs = append(objs,
		node("node-1", listsAttached(listed...), inUse(listed...)),
		// An orphan (its VolumeAttachment sorts after the settled ones')...
		csiPV("claim-orphan", "x-orphan"), va("claim-orphan", "x-orphan", "node-1"),
		// ...and a pod created while the controller was down.
		csiPV("claim-new", "x-new"), claim("claim-new"), pod("pod-new", "node-1", "claim-new"),
	)
	f := newFixture(t, objs...)
	held, err := f.c.RecoverHeld(f.ctx)
	if err != nil {
		t.Fatalf("RecoverHeld: %v", err)
	}
	first := []cache.Key{
		{Volume: volume.Name(csiName("x-orphan")), Node: "node-1"},
		{Volume: volume.Name(csiName("x-new")), Node: "node-1"},
	}
	if len(held) != len(first)+len(settled) || fmt.Sprint(held[:len(first)]) != fmt.Sprint(first) {
		t.Fatalf("keys held back: %v, want %v first, then the %d settled", held, first, len(settled))
	}
	for _, k := range held[len(first):] {
		if !settled[k] {
			t.Errorf("key %v among the settled, want only %v", k, settled)
		}
		delete(settled, k)
	}
}

// A key an event queues after a restart waits behind at most depth of the
// keys recovery found, however many there are; and every one of those is
// queued in the end.
func TestFeedRecovered(t *testing.T) {
	const total, depth = 1000, 10
	queue := workqueue.NewTyped[cache.Key]()
	defer queue.ShutDown()
	var keys []cache.Key
	for i := range total {
		keys = append(keys, cache.Key{Volume: volume.Name(fmt.Sprintf("v-%04d", i)), Node: "node-1"})
	}
	tick := make(chan time.Time)
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		feedRecovered(context.Background(), queue, keys, depth, tick)
	}()
	// The feeder fills the queue to depth and waits for a tick.
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return queue.Len() == depth, nil }); err != nil {
		t.Fatalf("queue holds %d keys, want %d", queue.Len(), depth)
	}
	fresh := cache.Key{Volume: "new-pod-volume", Node: "node-2"}
	queue.Add(fresh)
	seen := map[cache.Key]bool{}
	freshAt := 0
	for len(seen) < total+1 {
		if queue.Len() == 0 {
			select {
			case tick <- time.Now():
			case <-fed:
				// Returned: every key it had is in.
				if queue.Len() == 0 {
					t.Fatalf("feedRecovered returned with %d of %d keys queued", len(seen), total+1)
				}
			}
			continue
		}
		k, _ := queue.Get()
		if seen[k] {
			t.Fatalf("key %v queued twice", k)
		}
		seen[k] = true
		if k == fresh {
			freshAt = len(seen)
		}
		queue.Done(k)
	}
	if freshAt == 0 || freshAt > depth+1 {
		t.Errorf("the key queued after recovery came out %dth, want within the first %d", freshAt, depth+1)
	}
	select {
	case <-fed:
	case <-time.After(10 * time.Second):
		t.Fatal("feedRecovered did not return once every key was queued")
	}
}
