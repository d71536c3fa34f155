// Package guard detects another attach/detach controller acting beside this
// one, typically kube-controller-manager with its attachdetach controller
// still enabled. Two writers rewrite node.status.volumesAttached over each
// other and race to create and delete VolumeAttachments: kubelet may then
// mount a volume one of them is detaching.
//
// The API server records who writes what: every object's managedFields lists
// each field manager with the time of its last write. Another controller is
// a field manager other than this controller's that, after this controller
// started leading (entries left by a controller that ran before the cut-over
// are old and ignored),
//
//   - on a VolumeAttachment owns `spec` (it created or rewrote it),
//   - on a Node's status subresource owns `volumesAttached`, or
//   - wrote an Event of source attachdetach-controller with the reason of an
//     attach (SuccessfulAttachVolume, FailedAttachVolume).
//
// The first two need a disagreement: while both controllers agree, the
// other's writes change nothing (the API server drops them) or fail with
// AlreadyExists, and leave no trace. The third does not: kube-controller-
// manager's attachdetach controller posts SuccessfulAttachVolume on the pod
// of every attach it believes it made, whoever created the VolumeAttachment.
// This controller posts the same events under the same source (users'
// tooling reads them), so only the Event's writer tells them apart.
//
// Cost at scale: the VolumeAttachments and Nodes are what the controller
// already reads. The controller's informers hand every Node and
// VolumeAttachment they receive to Observe before dropping managedFields, and
// every deletion to Forget. Events take one watch of its own (WatchEvents),
// started at the API's current resourceVersion (no initial list) and
// filtered by the API server to source=attachdetach-controller: it brings
// this controller's own events back (dropped at once) and another's; nothing
// is cached. The guard keeps one finding per object written by another
// manager, at most maxEventFindings of them Events.
//
// The first finding of a writer is reported at once (metric, log line,
// Warning event, Summary for /explain); then every Period while it lasts.
package guard

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Reason is the reason of the Warning event.
const Reason = "AnotherAttachDetachController"

const (
	// maxEventFindings bounds the Events kept as findings: beyond it, an
	// Event of another controller is not counted until one kept is gone.
	maxEventFindings = 1000
	// eventLife is how long an Event counts after its write, at most: the
	// API server's default --event-ttl, after which it deletes the Event.
	// A deletion the watch missed (a resumed watch skips what happened
	// meanwhile) ends the finding then.
	eventLife = time.Hour
)

var (
	nodesGVR  = v1.SchemeGroupVersion.WithResource("nodes")
	vasGVR    = storagev1.SchemeGroupVersion.WithResource("volumeattachments")
	eventsGVR = v1.SchemeGroupVersion.WithResource("events")
)

// Config configures a Guard.
type Config struct {
	// Self are this controller's field managers; their writes are ours.
	Self []string
	// Since: writes older than this are ignored (the start of leadership).
	Since time.Time
	// Period between reports (metric, log line, events) while another
	// writer lasts.
	Period time.Duration
	// Recorder posts the Warning event, on the object written (for an
	// Event, on the object it is about).
	Recorder record.EventRecorder
	// Registerer receives the metric
	// attachdetach_controller_other_writer_objects{resource}.
	Registerer prometheus.Registerer
	// Clock tells the time; nil: the real clock.
	Clock clock.PassiveClock
}

// Finding is one object written by another manager.
type Finding struct {
	Resource string // "volumeattachments", "nodes" or "events"
	Name     string // an Event's is namespace/name
	Manager  string
	Time     time.Time
	// Reason and InvolvedObject are an Event's: what it says the other
	// controller did, and to what.
	Reason         string
	InvolvedObject v1.ObjectReference
}

// Guard keeps what Observe found; see the package documentation.
type Guard struct {
	cfg     Config
	writers *prometheus.GaugeVec
	// wake asks Run for a check now: a writer not reported yet was found.
	wake chan struct{}

	mu       sync.Mutex
	findings map[string]*finding // resource/name -> the latest write of another manager
	events   int                 // findings of resource events
	reported map[string]bool     // manager/resource -> a check reported it
	summary  string              // what the last check found, for /explain
}

// finding is a Finding with what became of it. A finding lasts as long as
// its object's latest version shows the other writer, and at least until a
// check has reported it: a write whose object is deleted or taken over at
// once (this controller deleting the other's VolumeAttachment before a check)
// is still logged, counted and posted once.
type finding struct {
	Finding
	checked bool // a check reported it
	gone    bool // its object went or no longer shows the other writer
}

// New returns a Guard with its metric registered.
func New(cfg Config) (*Guard, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	g := &Guard{
		cfg: cfg,
		writers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "attachdetach_controller_other_writer_objects",
			Help: "Objects another field manager (another attach/detach controller) wrote since this one leads, by resource (nodes: status.volumesAttached, volumeattachments: spec, events: an attach's event posted as attachdetach-controller); 0 when none.",
		}, []string{"resource"}),
		wake:     make(chan struct{}, 1),
		findings: map[string]*finding{},
		reported: map[string]bool{},
	}
	for _, r := range resources() {
		g.writers.WithLabelValues(r).Set(0)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(g.writers); err != nil {
			return nil, fmt.Errorf("register guard metric: %w", err)
		}
	}
	return g, nil
}

func resources() []string {
	return []string{eventsGVR.Resource, nodesGVR.Resource, vasGVR.Resource}
}

// SetRecorder sets the recorder of the Warning events (the controller's,
// made after the guard).
func (g *Guard) SetRecorder(r record.EventRecorder) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cfg.Recorder = r
}

// Unregister removes the metric (a new leadership registers a new Guard).
func (g *Guard) Unregister() {
	if g.cfg.Registerer != nil {
		g.cfg.Registerer.Unregister(g.writers)
	}
}

// Run reports at once, then every Period, and as soon as a writer not
// reported yet is found, until ctx is cancelled.
func (g *Guard) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("guard")
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Watching for another attach/detach controller", "period", g.cfg.Period, "self", g.cfg.Self)
	t := time.NewTicker(g.cfg.Period)
	defer t.Stop()
	for {
		g.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-g.wake:
		}
	}
}

// Observe reads who wrote a Node's status.volumesAttached, a
// VolumeAttachment's spec, or an Event of an attach; other objects are
// ignored.
func (g *Guard) Observe(obj any) {
	var (
		key   string
		f     Finding
		found bool
	)
	switch o := obj.(type) {
	case *v1.Node:
		key = nodesGVR.Resource + "/" + o.Name
		f, found = g.other(nodesGVR, &o.ObjectMeta, "status", "f:volumesAttached")
	case *storagev1.VolumeAttachment:
		key = vasGVR.Resource + "/" + o.Name
		f, found = g.other(vasGVR, &o.ObjectMeta, "", "f:spec")
	case *v1.Event:
		key = eventKey(o)
		f, found = g.otherEvent(o)
	default:
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if found {
		g.setLocked(key, f)
	} else {
		g.dropLocked(key)
	}
}

func eventKey(e *v1.Event) string {
	return eventsGVR.Resource + "/" + e.Namespace + "/" + e.Name
}

// setLocked records f, found on the object at key; a writer not reported
// yet wakes Run.
func (g *Guard) setLocked(key string, f Finding) {
	if _, ok := g.findings[key]; !ok {
		if f.Resource == eventsGVR.Resource {
			if g.events >= maxEventFindings {
				return
			}
			g.events++
		}
	}
	g.findings[key] = &finding{Finding: f}
	if !g.reported[f.Manager+"/"+f.Resource] {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
}

func (g *Guard) deleteLocked(key string) {
	if f, ok := g.findings[key]; ok {
		if f.Resource == eventsGVR.Resource {
			g.events--
		}
		delete(g.findings, key)
	}
}

// dropLocked drops a finding a check reported; one not reported yet is
// dropped by the next check.
func (g *Guard) dropLocked(key string) {
	if f, ok := g.findings[key]; ok {
		if f.checked {
			g.deleteLocked(key)
		} else {
			f.gone = true
		}
	}
}

// Forget drops what was found on a deleted Node, VolumeAttachment or Event,
// once reported.
func (g *Guard) Forget(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	var key string
	switch o := obj.(type) {
	case *v1.Node:
		key = nodesGVR.Resource + "/" + o.Name
	case *storagev1.VolumeAttachment:
		key = vasGVR.Resource + "/" + o.Name
	case *v1.Event:
		key = eventKey(o)
	default:
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropLocked(key)
}

// Check updates the metric, logs and posts events for what was found so
// far; it returns the findings, sorted.
func (g *Guard) Check(ctx context.Context) []Finding {
	logger := klog.FromContext(ctx)
	now := g.cfg.Clock.Now()
	g.mu.Lock()
	found := make([]Finding, 0, len(g.findings))
	for key, f := range g.findings {
		if f.Resource == eventsGVR.Resource && now.Sub(f.Time) > eventLife {
			g.deleteLocked(key)
			continue
		}
		found = append(found, f.Finding)
		f.checked = true
		if f.gone {
			g.deleteLocked(key)
		}
	}
	g.mu.Unlock()
	sort.Slice(found, func(i, j int) bool {
		if found[i].Resource != found[j].Resource {
			return found[i].Resource < found[j].Resource
		}
		return found[i].Name < found[j].Name
	})
	counts := map[[2]string]int{}
	perResource := map[string]int{}
	for _, r := range resources() {
		perResource[r] = 0
	}
	for _, f := range found {
		counts[[2]string{f.Resource, f.Manager}]++
		perResource[f.Resource]++
	}
	for r, n := range perResource {
		g.writers.WithLabelValues(r).Set(float64(n))
	}
	for k, n := range counts {
		logger.Error(nil, "Another attach/detach controller writes beside this one: disable it (kube-controller-manager --controllers=*,-attachdetach)",
			"resource", k[0], "manager", k[1], "objects", n)
	}
	g.report(found)
	return found
}

// Summary says what the last check found, for /explain: empty when
// nothing.
func (g *Guard) Summary() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.summary
}

func (g *Guard) report(found []Finding) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.summary = summarize(found)
	for _, f := range found {
		key := f.Manager + "/" + f.Resource
		if g.reported[key] {
			continue
		}
		g.reported[key] = true
		if g.cfg.Recorder == nil {
			continue
		}
		g.cfg.Recorder.Eventf(f.reference(), v1.EventTypeWarning, Reason,
			"Field manager %q %s, beside attach-detach-controller: two attach/detach controllers run. Disable kube-controller-manager's with --controllers=*,-attachdetach",
			f.Manager, f.what())
	}
}

// reference returns the object the Warning event is posted on: the object
// written, or the one an Event is about.
func (f Finding) reference() *v1.ObjectReference {
	switch f.Resource {
	case vasGVR.Resource:
		return &v1.ObjectReference{Name: f.Name, APIVersion: storagev1.SchemeGroupVersion.String(), Kind: "VolumeAttachment"}
	case eventsGVR.Resource:
		io := f.InvolvedObject
		return &v1.ObjectReference{Kind: io.Kind, APIVersion: io.APIVersion, Namespace: io.Namespace, Name: io.Name, UID: io.UID}
	default:
		return &v1.ObjectReference{Name: f.Name, APIVersion: "v1", Kind: "Node"}
	}
}

// what says what the other manager did, and when.
func (f Finding) what() string {
	at := f.Time.UTC().Format(time.RFC3339)
	switch f.Resource {
	case vasGVR.Resource:
		return fmt.Sprintf("wrote spec of VolumeAttachment %s at %s", f.Name, at)
	case eventsGVR.Resource:
		io := f.InvolvedObject
		return fmt.Sprintf("posted %s about %s %s/%s as %s at %s (Event %s)", f.Reason, io.Kind, io.Namespace, io.Name, EventSource, at, f.Name)
	default:
		return fmt.Sprintf("wrote status.volumesAttached of Node %s at %s", f.Name, at)
	}
}

// summarize says who was found, the latest thing each did, and what to do.
func summarize(found []Finding) string {
	if len(found) == 0 {
		return ""
	}
	counts := map[string]map[string]int{}
	latest := map[string]Finding{}
	for _, f := range found {
		if counts[f.Manager] == nil {
			counts[f.Manager] = map[string]int{}
		}
		counts[f.Manager][f.Resource]++
		if l, ok := latest[f.Manager]; !ok || f.Time.After(l.Time) {
			latest[f.Manager] = f
		}
	}
	var managers []string
	for m, byResource := range counts {
		var n []string
		for _, r := range resources() {
			if byResource[r] > 0 {
				n = append(n, fmt.Sprintf("%d %s", byResource[r], r))
			}
		}
		managers = append(managers, fmt.Sprintf("field manager %q (%s; latest: %s)", m, strings.Join(n, ", "), latest[m].what()))
	}
	sort.Strings(managers)
	return "another attach/detach controller acts beside this one: " + strings.Join(managers, "; ") +
		". Disable it: kube-controller-manager --controllers=*,-attachdetach (docs/operations.md, \"Another attach/detach controller\")"
}

// other returns the most recent write of field, on subresource, by a
// manager not ours, since cfg.Since.
func (g *Guard) other(gvr schema.GroupVersionResource, m *metav1.ObjectMeta, subresource, field string) (Finding, bool) {
	var f Finding
	for _, e := range m.ManagedFields {
		if e.Subresource != subresource || e.Time == nil || e.Time.Time.Before(g.cfg.Since) || g.self(e.Manager) {
			continue
		}
		if e.FieldsV1 == nil || !bytes.Contains(e.FieldsV1.GetRawBytes(), []byte(`"`+field+`"`)) {
			continue
		}
		if f.Time.IsZero() || e.Time.Time.After(f.Time) {
			f = Finding{Resource: gvr.Resource, Name: m.Name, Manager: e.Manager, Time: e.Time.Time}
		}
	}
	return f, !f.Time.IsZero()
}

func (g *Guard) self(manager string) bool {
	for _, s := range g.cfg.Self {
		if strings.EqualFold(s, manager) {
			return true
		}
	}
	return false
}
