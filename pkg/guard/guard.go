// Package guard detects another attach/detach controller writing beside this
// one, typically kube-controller-manager with its attachdetach controller
// still enabled. Two writers rewrite node.status.volumesAttached over each
// other and race to create and delete VolumeAttachments: kubelet may then
// mount a volume one of them is detaching.
//
// The API server records who writes what: every object's managedFields lists
// each field manager with the time of its last write. A writer other than
// this controller is one whose entry
//
//   - on a VolumeAttachment owns `spec` (it created or rewrote it), or
//   - on a Node's status subresource owns `volumesAttached`,
//
// dated after this controller started leading (entries left by a
// controller that ran before the cut-over are old and ignored).
//
// Cost at scale: nothing more than the controller already reads. The
// controller's informers hand every Node and VolumeAttachment they receive to
// Observe before dropping managedFields, and every deletion to Forget; the
// guard keeps one finding per object written by another manager. It makes
// no API request of its own, and a second writer is seen as soon as the
// watch delivers its write.
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
)

// Reason is the reason of the Warning event.
const Reason = "AnotherAttachDetachController"

var (
	nodesGVR = v1.SchemeGroupVersion.WithResource("nodes")
	vasGVR   = storagev1.SchemeGroupVersion.WithResource("volumeattachments")
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
	// Recorder posts the Warning event, on the object written.
	Recorder record.EventRecorder
	// Registerer receives the metric
	// attachdetach_controller_other_writer_objects{resource}.
	Registerer prometheus.Registerer
}

// Finding is one object written by another manager.
type Finding struct {
	Resource string // "volumeattachments" or "nodes"
	Name     string
	Manager  string
	Time     time.Time
}

// Guard keeps what Observe found; see the package documentation.
type Guard struct {
	cfg     Config
	writers *prometheus.GaugeVec

	mu       sync.Mutex
	findings map[string]*finding // resource/name -> the latest write of another manager
	reported map[string]bool     // manager/resource -> an event was posted
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
	g := &Guard{
		cfg: cfg,
		writers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "attachdetach_controller_other_writer_objects",
			Help: "Objects whose attach/detach fields another field manager (another attach/detach controller) wrote since this one leads, by resource (nodes: status.volumesAttached, volumeattachments: spec); 0 when none.",
		}, []string{"resource"}),
		findings: map[string]*finding{},
		reported: map[string]bool{},
	}
	for _, r := range []string{nodesGVR.Resource, vasGVR.Resource} {
		g.writers.WithLabelValues(r).Set(0)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(g.writers); err != nil {
			return nil, fmt.Errorf("register guard metric: %w", err)
		}
	}
	return g, nil
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

// Run reports at once, then every Period, until ctx is cancelled.
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
		}
	}
}

// Observe reads who wrote a Node's status.volumesAttached or a
// VolumeAttachment's spec; other objects are ignored.
func (g *Guard) Observe(obj any) {
	var (
		resource string
		f        Finding
		found    bool
		name     string
	)
	switch o := obj.(type) {
	case *v1.Node:
		resource, name = nodesGVR.Resource, o.Name
		f, found = g.other(nodesGVR, &o.ObjectMeta, "status", "f:volumesAttached")
	case *storagev1.VolumeAttachment:
		resource, name = vasGVR.Resource, o.Name
		f, found = g.other(vasGVR, &o.ObjectMeta, "", "f:spec")
	default:
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if found {
		g.findings[resource+"/"+name] = &finding{Finding: f}
	} else {
		g.dropLocked(resource + "/" + name)
	}
}

// dropLocked drops a finding a check reported; one not reported yet is
// dropped by the next check.
func (g *Guard) dropLocked(key string) {
	if f, ok := g.findings[key]; ok {
		if f.checked {
			delete(g.findings, key)
		} else {
			f.gone = true
		}
	}
}

// Forget drops what was found on a deleted Node or VolumeAttachment, once
// reported.
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
	g.mu.Lock()
	found := make([]Finding, 0, len(g.findings))
	for key, f := range g.findings {
		found = append(found, f.Finding)
		f.checked = true
		if f.gone {
			delete(g.findings, key)
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
	perResource := map[string]int{nodesGVR.Resource: 0, vasGVR.Resource: 0}
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

func (g *Guard) report(found []Finding) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cfg.Recorder == nil {
		return
	}
	for _, f := range found {
		if g.reported[f.Manager+"/"+f.Resource] {
			continue
		}
		g.reported[f.Manager+"/"+f.Resource] = true
		ref := &v1.ObjectReference{Name: f.Name, UID: "", APIVersion: "v1", Kind: "Node"}
		if f.Resource == vasGVR.Resource {
			ref = &v1.ObjectReference{Name: f.Name, APIVersion: storagev1.SchemeGroupVersion.String(), Kind: "VolumeAttachment"}
		}
		g.cfg.Recorder.Eventf(ref, v1.EventTypeWarning, Reason,
			"Field manager %q wrote %s of this %s at %s, beside attach-detach-controller: two attach/detach controllers run. Disable kube-controller-manager's with --controllers=*,-attachdetach",
			f.Manager, fieldOf(f.Resource), ref.Kind, f.Time.UTC().Format(time.RFC3339))
	}
}

func fieldOf(resource string) string {
	if resource == vasGVR.Resource {
		return "spec"
	}
	return "status.volumesAttached"
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
