package guard

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

const (
	ours = "attach-detach-controller"
	kcm  = "kube-controller-manager"
	// eventFields is what the event recorder's create sets.
	eventFields = `{"f:count":{},"f:firstTimestamp":{},"f:involvedObject":{},"f:lastTimestamp":{},"f:message":{},"f:reason":{},"f:reportingComponent":{},"f:source":{"f:component":{}},"f:type":{}}`
)

// event is an Event about pod ns/pod, as an event recorder posts it, with
// the managedFields the API server recorded.
func event(name, component, reason string, entries ...metav1.ManagedFieldsEntry) *v1.Event {
	return &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "ns", Name: name, ManagedFields: entries},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ns", Name: "pod-" + name, UID: types.UID("uid-" + name)},
		Reason:         reason,
		Message:        "AttachVolume.Attach succeeded for volume \"pv\" ",
		Source:         v1.EventSource{Component: component},
		Type:           v1.EventTypeNormal,
	}
}

// withFirst sets when the event was first seen: its writer's managedFields
// entry says when it was last written.
func withFirst(e *v1.Event, at time.Time) *v1.Event {
	e.FirstTimestamp = metav1.Time{Time: at}
	return e
}

func wrote(manager string, at time.Time) metav1.ManagedFieldsEntry {
	return entry(manager, "", eventFields, at)
}

// eventually fails t unless cond holds within 10 seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waited 10s for %s", what)
	}
}

// reference is what a recorder was asked to post.
type reference struct {
	ref     v1.ObjectReference
	message string
}

// refRecorder records the objects the Warning events are posted on.
type refRecorder struct {
	mu     sync.Mutex
	posted []reference
}

func (r *refRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, _ := obj.(*v1.ObjectReference)
	if ref == nil || eventtype != v1.EventTypeWarning || reason != Reason {
		panic(fmt.Sprintf("posted %T %s %s", obj, eventtype, reason))
	}
	r.posted = append(r.posted, reference{*ref, message})
}

func (r *refRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *refRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...any) {
	r.Eventf(obj, eventtype, reason, format, args...)
}

func (r *refRecorder) all() []reference {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reference(nil), r.posted...)
}

// The events of attach/detach controllers name another when its field
// manager, not this controller's, posted an attach's event, as
// attachdetach-controller, since this one leads. Each case must be told
// apart by exactly one of those conditions: a filter that skips any of them
// fails here.
func TestEventsOfAnotherController(t *testing.T) {
	// Before: within the hour an Event counts, so that only the start of
	// leadership rules it out.
	after, before := since.Add(time.Minute), since.Add(-time.Minute)
	for _, tc := range []struct {
		name  string
		event *v1.Event
		want  bool
	}{
		{"kube-controller-manager attached", event("a", EventSource, "SuccessfulAttachVolume", wrote(kcm, after)), true},
		{"kube-controller-manager failed an attach", event("a", EventSource, "FailedAttachVolume", wrote(kcm, after)), true},
		{"kube-controller-manager patched the count of an old event", withFirst(event("a", EventSource, "SuccessfulAttachVolume",
			wrote(kcm, after)), before), true},
		{"this controller attached", event("a", EventSource, "SuccessfulAttachVolume", wrote(ours, after)), false},
		{"this controller's manager, however spelled", event("a", EventSource, "FailedAttachVolume", wrote("Attach-Detach-Controller", after)), false},
		{"kube-controller-manager before this one led", event("a", EventSource, "SuccessfulAttachVolume", wrote(kcm, before)), false},
		{"kube-controller-manager's other controllers", event("a", "node-controller", "RegisteredNode", wrote(kcm, after)), false},
		{"another component's attach reason", event("a", "persistentvolume-controller", "FailedAttachVolume", wrote(kcm, after)), false},
		{"kubelet attaching itself", event("a", "kubelet", "SuccessfulAttachVolume", wrote("kubelet", after)), false},
		{"another reason of attachdetach-controller", event("a", EventSource, "FailedMount", wrote(kcm, after)), false},
		{"this controller's own warning", event("a", EventSource, Reason, wrote(ours, after)), false},
		{"no writer recorded", event("a", EventSource, "SuccessfulAttachVolume"), false},
		{"a write of a subresource", event("a", EventSource, "SuccessfulAttachVolume", entry(kcm, "status", eventFields, after)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &refRecorder{}
			reg := prometheus.NewRegistry()
			g, err := New(Config{Self: []string{ours}, Since: since, Period: time.Minute, Recorder: rec, Registerer: reg,
				Clock: clocktesting.NewFakePassiveClock(after)})
			if err != nil {
				t.Fatal(err)
			}
			g.Observe(tc.event)
			found := g.Check(context.Background())
			want := 0.0
			if tc.want {
				want = 1
			}
			if got := testutil.ToFloat64(g.writers.WithLabelValues("events")); got != want {
				t.Errorf("events: %v, want %v (findings %+v)", got, want, found)
			}
			posted := rec.all()
			if !tc.want {
				if len(posted) != 0 || g.Summary() != "" {
					t.Errorf("reported: events %+v, summary %q", posted, g.Summary())
				}
				return
			}
			// The Warning goes on the pod the event is about, and says
			// who and what to do.
			if len(posted) != 1 {
				t.Fatalf("%d Warning events, want 1: %+v", len(posted), posted)
			}
			wantRef := v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ns", Name: "pod-a", UID: "uid-a"}
			if posted[0].ref != wantRef {
				t.Errorf("Warning on %+v, want on %+v", posted[0].ref, wantRef)
			}
			for _, s := range []string{`"kube-controller-manager"`, tc.event.Reason, "--controllers=*,-attachdetach"} {
				if !strings.Contains(posted[0].message, s) || !strings.Contains(g.Summary(), strings.Trim(s, `"`)) {
					t.Errorf("Warning %q or summary %q lacks %s", posted[0].message, g.Summary(), s)
				}
			}
		})
	}
}

// An Event found counts while it exists, at most eventLife after its
// write; at most maxEventFindings of them are kept.
func TestEventFindingsEnd(t *testing.T) {
	after := since.Add(time.Minute)
	clock := clocktesting.NewFakePassiveClock(after)
	g, err := New(Config{Self: []string{ours}, Since: since, Period: time.Minute, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int { return len(g.Check(context.Background())) }
	for i := range maxEventFindings + 10 {
		g.Observe(event(fmt.Sprint(i), EventSource, "SuccessfulAttachVolume", wrote(kcm, after)))
	}
	if got := count(); got != maxEventFindings {
		t.Fatalf("%d findings, want %d (the bound)", got, maxEventFindings)
	}
	// Deleted: no longer counted, and room for another.
	g.Forget(toolscache.DeletedFinalStateUnknown{Obj: event("0", EventSource, "SuccessfulAttachVolume")})
	g.Forget(event("1", EventSource, "SuccessfulAttachVolume"))
	if got := count(); got != maxEventFindings-2 {
		t.Fatalf("after two deletions: %d findings, want %d", got, maxEventFindings-2)
	}
	g.Observe(event("new", EventSource, "SuccessfulAttachVolume", wrote(kcm, after.Add(time.Minute))))
	if got := count(); got != maxEventFindings-1 {
		t.Fatalf("after another: %d findings, want %d", got, maxEventFindings-1)
	}
	// An hour after their write, the API server has deleted them, whether
	// or not the watch said so.
	clock.SetTime(after.Add(eventLife + time.Second))
	if found := g.Check(context.Background()); len(found) != 1 || found[0].Name != "ns/new" {
		t.Fatalf("an hour later: %+v, want only the newest", found)
	}
	if got := testutil.ToFloat64(g.writers.WithLabelValues("events")); got != 1 {
		t.Errorf("metric: %v, want 1", got)
	}
}

// The first finding of a writer is reported at once, whatever the period;
// further findings of that writer wait for the period.
func TestFirstFindingReportedAtOnce(t *testing.T) {
	after := time.Now()
	g, err := New(Config{Self: []string{ours}, Since: after.Add(-time.Second), Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	metric := func() float64 { return testutil.ToFloat64(g.writers.WithLabelValues("events")) }
	g.Observe(event("a", EventSource, "SuccessfulAttachVolume", wrote(kcm, after)))
	eventually(t, "the metric at 1, an hour before the period", func() bool { return metric() == 1 })
	// Another writer too.
	g.Observe(node("n", entry("another-controller", "status", volumesAttached, after)))
	eventually(t, "the node's metric at 1", func() bool { return testutil.ToFloat64(g.writers.WithLabelValues("nodes")) == 1 })
}

// Only a writer not reported yet asks for a check: a burst of another
// controller's events makes one check, not one each.
func TestOnlyANewWriterWakesTheCheck(t *testing.T) {
	after := since.Add(time.Minute)
	g, err := New(Config{Self: []string{ours}, Since: since, Period: time.Hour, Clock: clocktesting.NewFakePassiveClock(after)})
	if err != nil {
		t.Fatal(err)
	}
	woken := func() bool {
		select {
		case <-g.wake:
			return true
		default:
			return false
		}
	}
	g.Observe(event("a", EventSource, "SuccessfulAttachVolume", wrote(kcm, after)))
	g.Observe(event("b", EventSource, "SuccessfulAttachVolume", wrote(kcm, after)))
	if !woken() || woken() {
		t.Fatalf("two findings of a new writer: want one wake")
	}
	g.Observe(event("c", EventSource, "SuccessfulAttachVolume", wrote(ours, after)))
	if woken() {
		t.Fatalf("this controller's event woke the check")
	}
	g.Check(context.Background())
	g.Observe(event("d", EventSource, "SuccessfulAttachVolume", wrote(kcm, after)))
	if woken() {
		t.Errorf("a finding of a reported writer woke the check")
	}
	// The same manager writing another resource is news.
	g.Observe(va("v", entry(kcm, "", spec, after)))
	if !woken() {
		t.Errorf("a new resource written did not wake the check")
	}
}

// WatchEvents watches from the API's current resourceVersion, selecting
// attachdetach-controller's events, resumes where it was when a watch
// ends, and from now when that is too old; it returns when ctx ends.
func TestWatchEvents(t *testing.T) {
	after := time.Now()
	g, err := New(Config{Self: []string{ours}, Since: after.Add(-time.Second), Period: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	var (
		mu      sync.Mutex
		lists   int
		watches []metav1.ListOptions
		current *watch.RaceFreeFakeWatcher
	)
	client.PrependReactor("list", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		lists++
		opts := a.(k8stesting.ListActionImpl).ListOptions
		if opts.Limit != 1 || opts.FieldSelector != "" {
			t.Errorf("list of events with %+v, want a limit of 1 and no selector", opts)
		}
		return true, &v1.EventList{ListMeta: metav1.ListMeta{ResourceVersion: fmt.Sprint(100 * lists)}}, nil
	})
	client.PrependWatchReactor("events", func(a k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		watches = append(watches, a.(k8stesting.WatchActionImpl).ListOptions)
		current = watch.NewRaceFreeFake()
		return true, current, nil
	})
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return cond()
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.WatchEvents(ctx, client)
	}()

	waitFor("a watch", func() bool { return len(watches) == 1 })
	mu.Lock()
	if w := watches[0]; w.FieldSelector != "source=attachdetach-controller" || w.ResourceVersion != "100" {
		t.Errorf("watch with selector %q from %q, want source=attachdetach-controller from the list's 100", w.FieldSelector, w.ResourceVersion)
	}
	w := current
	mu.Unlock()
	withRV := func(e *v1.Event, rv string) *v1.Event {
		e.ResourceVersion = rv
		return e
	}
	w.Add(withRV(event("a", EventSource, "SuccessfulAttachVolume", wrote(kcm, after)), "101"))
	w.Add(withRV(event("b", EventSource, "SuccessfulAttachVolume", wrote(ours, after)), "102"))
	w.Modify(withRV(event("c", EventSource, "FailedAttachVolume", wrote(kcm, after)), "103"))
	waitFor("two findings", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.findings) == 2
	})
	if found := g.Check(ctx); len(found) != 2 || found[0].Name != "ns/a" || found[1].Name != "ns/c" {
		t.Fatalf("found %+v, want ns/a and ns/c", found)
	}
	w.Delete(withRV(event("a", EventSource, "SuccessfulAttachVolume"), "104"))
	waitFor("the deletion", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.findings) == 1
	})

	// The watch ends: the next resumes after the last event.
	w.Stop()
	waitFor("a second watch", func() bool { return len(watches) == 2 })
	mu.Lock()
	if rv := watches[1].ResourceVersion; rv != "104" || lists != 1 {
		t.Errorf("second watch from %q after %d lists, want from 104 without a list", rv, lists)
	}
	w = current
	mu.Unlock()
	// Too old: from now again.
	gone := apierrors.NewResourceExpired("too old resource version")
	w.Error(&gone.ErrStatus)
	waitFor("a third watch", func() bool { return len(watches) == 3 })
	mu.Lock()
	if rv := watches[2].ResourceVersion; rv != "200" || lists != 2 {
		t.Errorf("third watch from %q after %d lists, want from the second list's 200", rv, lists)
	}
	mu.Unlock()

	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchEvents still running 10s after its context ended")
	}
}

// A watch refused (the ClusterRole lacks list or watch on events) is
// retried; the guard keeps running.
func TestWatchEventsRetriesARefusal(t *testing.T) {
	g, err := New(Config{Self: []string{ours}, Since: time.Now(), Period: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset()
	var mu sync.Mutex
	lists := 0
	client.PrependReactor("list", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		lists++
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "events"}, "", fmt.Errorf("no"))
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.WatchEvents(ctx, client)
	}()
	eventually(t, "a list retried after a refusal", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lists >= 2
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("WatchEvents still running 10s after its context ended")
	}
}
