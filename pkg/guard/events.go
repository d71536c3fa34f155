package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
)

// EventSource is the source component of the events an attach/detach
// controller posts: kube-controller-manager's (pkg/controller/volume/
// attachdetach) and this one's.
const EventSource = "attachdetach-controller"

// EventSelector is the field selector of the guard's watch on Events: the
// API server selects core/v1 Events by source (source.component, else
// reportingComponent) in every supported release.
const EventSelector = "source=" + EventSource

// attachReason reports whether an event of this reason says an attach/detach
// controller acted: upstream's operation generator posts
// SuccessfulAttachVolume on each pod of an attach it made, and its attach
// and reconciler post FailedAttachVolume (a failed attach, "Multi-Attach
// error", "Waiting for detach"). Its detaches post nothing.
func attachReason(reason string) bool {
	return reason == "SuccessfulAttachVolume" || reason == "FailedAttachVolume"
}

// otherEvent returns the latest write, since cfg.Since, by a manager not
// ours, of an Event of an attach posted as EventSource. An Event carries no
// subresource and its writer owns every field it sets: the manager is the
// writer. One without managedFields names no writer and is ignored.
func (g *Guard) otherEvent(e *v1.Event) (Finding, bool) {
	if e.Source.Component != EventSource || !attachReason(e.Reason) {
		return Finding{}, false
	}
	var f Finding
	for _, m := range e.ManagedFields {
		if m.Subresource != "" || m.Time == nil || m.Time.Time.Before(g.cfg.Since) || g.self(m.Manager) {
			continue
		}
		if f.Time.IsZero() || m.Time.Time.After(f.Time) {
			f = Finding{Resource: eventsGVR.Resource, Name: e.Namespace + "/" + e.Name, Manager: m.Manager, Time: m.Time.Time,
				Reason: e.Reason, InvolvedObject: e.InvolvedObject}
		}
	}
	return f, !f.Time.IsZero()
}

// errExpired: the watch's resourceVersion is too old; start again from now.
var errExpired = errors.New("resourceVersion expired")

// WatchEvents hands Observe and Forget the Events posted as EventSource from
// now on, until ctx is cancelled. It lists nothing: a list of one Event
// gives the API's current resourceVersion, and the watch starts there; a
// watch that ends resumes where it was, or from now when that is too old.
// Failures are logged and retried with a backoff (1s doubling to 1m): the
// controller runs on whether or not the guard can watch.
func (g *Guard) WatchEvents(ctx context.Context, client kubernetes.Interface) {
	logger := klog.FromContext(ctx).WithName("guard")
	// No pod waits for these requests.
	ctx = budget.WithPriority(ctx, budget.Other)
	events := client.CoreV1().Events(metav1.NamespaceAll)
	backoff := newBackoff()
	var rv string
	started := false
	for {
		var err error
		if !started {
			rv, err = currentResourceVersion(ctx, events)
			started = err == nil
		}
		if started {
			rv, err = g.followEvents(ctx, events, rv)
			if errors.Is(err, errExpired) {
				started, err = false, nil
			}
		}
		if ctx.Err() != nil {
			return
		}
		// A watch that ended resumes after a second, as client-go's
		// RetryWatcher does: a server that ends every watch at once is not
		// asked again in a loop.
		delay := time.Second
		if err != nil {
			delay = backoff.Step()
			logger.Error(err, "Watching the events of attach/detach controllers; retrying", "after", delay)
		} else {
			backoff = newBackoff()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

func newBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: 7, Cap: time.Minute}
}

// currentResourceVersion returns the resourceVersion of Events now: that of
// a list of one, whatever its selector (unselected, the API server reads
// one Event, where a selector could make it read them all).
func currentResourceVersion(ctx context.Context, events typedcorev1.EventInterface) (string, error) {
	list, err := events.List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return "", fmt.Errorf("list events: %w", err)
	}
	return list.ResourceVersion, nil
}

// followEvents watches Events posted as EventSource from rv until the watch
// ends or ctx is cancelled, and returns the last resourceVersion seen.
func (g *Guard) followEvents(ctx context.Context, events typedcorev1.EventInterface, rv string) (string, error) {
	w, err := events.Watch(ctx, metav1.ListOptions{FieldSelector: EventSelector, ResourceVersion: rv, AllowWatchBookmarks: true})
	if err != nil {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return rv, errExpired
		}
		return rv, fmt.Errorf("watch events: %w", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return rv, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, nil
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				g.Observe(ev.Object)
			case watch.Deleted:
				g.Forget(ev.Object)
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					return rv, errExpired
				}
				return rv, fmt.Errorf("watch events: %w", err)
			}
			if m, err := meta.Accessor(ev.Object); err == nil && m.GetResourceVersion() != "" {
				rv = m.GetResourceVersion()
			}
		}
	}
}
