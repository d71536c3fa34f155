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
// Cost at scale: the informers of pkg/controller drop managedFields, so the
// guard lists on its own, metadata only (no spec, no status), in pages.
// VolumeAttachments, small and one per attachment, are listed whole at each
// check; nodes, whose managedFields are large, one page per check, the next
// page at the next check: at 10,000 nodes and pages of 500, a full pass over
// the nodes takes 20 checks, and a check costs one page of node metadata
// plus the VolumeAttachments' whatever the cluster size. A second writer of
// CSI volumes is seen at the first check, since it creates VolumeAttachments
// too (or rewrites node status on the nodes that have them).
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata"
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
	Client metadata.Interface
	// Self are this controller's field managers; their writes are ours.
	Self []string
	// Since: writes older than this are ignored (the start of leadership).
	Since time.Time
	// Period between checks.
	Period time.Duration
	// PageSize of the lists (500 if 0).
	PageSize int64
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

// Guard checks periodically; see the package documentation.
type Guard struct {
	cfg     Config
	writers *prometheus.GaugeVec

	mu           sync.Mutex
	nodeContinue string
	nodeFindings map[string]Finding // node name -> finding, kept across pages
	reported     map[string]bool    // manager -> an event was posted
}

// New returns a Guard with its metric registered.
func New(cfg Config) (*Guard, error) {
	if cfg.PageSize == 0 {
		cfg.PageSize = 500
	}
	g := &Guard{
		cfg: cfg,
		writers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "attachdetach_controller_other_writer_objects",
			Help: "Objects whose attach/detach fields another field manager (another attach/detach controller) wrote since this one leads, by resource (nodes: status.volumesAttached, volumeattachments: spec); 0 when none.",
		}, []string{"resource"}),
		nodeFindings: map[string]Finding{},
		reported:     map[string]bool{},
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

// Unregister removes the metric (a new leadership registers a new Guard).
func (g *Guard) Unregister() {
	if g.cfg.Registerer != nil {
		g.cfg.Registerer.Unregister(g.writers)
	}
}

// Run checks at once, then every Period, until ctx is cancelled.
func (g *Guard) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("guard")
	ctx = klog.NewContext(ctx, logger)
	logger.Info("Checking for another attach/detach controller", "period", g.cfg.Period, "self", g.cfg.Self)
	t := time.NewTicker(g.cfg.Period)
	defer t.Stop()
	for {
		if _, err := g.Check(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Checking for another attach/detach controller")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check lists the VolumeAttachments and one page of nodes, updates the
// metric, logs and posts events; it returns what it found.
func (g *Guard) Check(ctx context.Context) ([]Finding, error) {
	logger := klog.FromContext(ctx)
	vas, err := g.checkVolumeAttachments(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := g.checkNodePage(ctx)
	if err != nil {
		return nil, err
	}
	found := append(vas, nodes...)
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
	return found, nil
}

func (g *Guard) report(found []Finding) {
	if g.cfg.Recorder == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
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

func (g *Guard) checkVolumeAttachments(ctx context.Context) ([]Finding, error) {
	var found []Finding
	opts := metav1.ListOptions{Limit: g.cfg.PageSize}
	for {
		list, err := g.cfg.Client.Resource(vasGVR).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list volumeattachments metadata: %w", err)
		}
		for i := range list.Items {
			if f, ok := g.other(vasGVR, &list.Items[i].ObjectMeta, "", "f:spec"); ok {
				found = append(found, f)
			}
		}
		if list.Continue == "" {
			return found, nil
		}
		opts.Continue = list.Continue
	}
}

// checkNodePage reads the next page of nodes; findings of earlier pages of
// the same pass are kept until their page is read again.
func (g *Guard) checkNodePage(ctx context.Context) ([]Finding, error) {
	g.mu.Lock()
	cont := g.nodeContinue
	g.mu.Unlock()
	list, err := g.cfg.Client.Resource(nodesGVR).List(ctx, metav1.ListOptions{Limit: g.cfg.PageSize, Continue: cont})
	if apierrors.IsResourceExpired(err) && cont != "" {
		// The continue token outlived its snapshot: start a new pass.
		list, err = g.cfg.Client.Resource(nodesGVR).List(ctx, metav1.ListOptions{Limit: g.cfg.PageSize})
	}
	if err != nil {
		return nil, fmt.Errorf("list nodes metadata: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range list.Items {
		m := &list.Items[i].ObjectMeta
		if f, ok := g.other(nodesGVR, m, "status", "f:volumesAttached"); ok {
			g.nodeFindings[m.Name] = f
		} else {
			delete(g.nodeFindings, m.Name)
		}
	}
	g.nodeContinue = list.Continue
	found := make([]Finding, 0, len(g.nodeFindings))
	for _, f := range g.nodeFindings {
		found = append(found, f)
	}
	sort.Slice(found, func(i, j int) bool { return found[i].Name < found[j].Name })
	return found, nil
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
