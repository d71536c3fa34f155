package stack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// AttachmentWatch watches, for as long as its context lives, every
// VolumeAttachment and every node's status.volumesAttached, and records
// each moment a single-node volume was attached to two nodes at once:
//
//   - VolumeAttachments of one volume on two nodes, in any state (one
//     being deleted still holds the disk until the attacher removed it);
//   - one unique volume name in the volumesAttached of two nodes.
//
// Each source is judged on its own watch, in the order the API serves it:
// the two watches are not ordered against each other, so a volume listed on
// one node while its VolumeAttachment to another still exists is not
// judged (the controller removes the first before it detaches; the
// VolumeAttachments tell the rest). A volume is single-node unless its PV
// has ReadWriteMany or ReadOnlyMany among its access modes, as upstream's
// IsMultiAttachAllowed reads it; a volume whose PV is not known is treated
// as single-node.
type AttachmentWatch struct {
	started time.Time

	mu sync.Mutex
	// vas are the VolumeAttachments by name.
	vas map[string]*storagev1.VolumeAttachment
	// listed are the names each node's volumesAttached holds.
	listed map[string][]string
	// pvs are the PVs by name; pvOfName maps a CSI volume's unique name
	// (kubernetes.io/csi/DRIVER^HANDLE) to its PV.
	pvs        map[string]*v1.PersistentVolume
	pvOfName   map[string]string
	violations []string
	// active are the violations going on, by key: one is recorded when it
	// starts.
	active map[string]bool
	// maxNodes is the most nodes each volume was attached to at once,
	// by VolumeAttachments.
	maxNodes map[string]int

	factory informers.SharedInformerFactory
}

// WatchAttachments starts an AttachmentWatch and returns once its caches
// are synced: what exists then is judged too. It stops when ctx ends.
func WatchAttachments(ctx context.Context, client kubernetes.Interface) (*AttachmentWatch, error) {
	w := &AttachmentWatch{
		started:  time.Now(),
		vas:      map[string]*storagev1.VolumeAttachment{},
		listed:   map[string][]string{},
		pvs:      map[string]*v1.PersistentVolume{},
		pvOfName: map[string]string{},
		maxNodes: map[string]int{},
		active:   map[string]bool{},
		factory:  informers.NewSharedInformerFactory(client, 0),
	}
	handlers := []watchHandler{
		{w.factory.Core().V1().PersistentVolumes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.pvSeen, UpdateFunc: func(_, o any) { w.pvSeen(o) },
		}},
		{w.factory.Storage().V1().VolumeAttachments().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.vaSeen, UpdateFunc: func(_, o any) { w.vaSeen(o) }, DeleteFunc: w.vaGone,
		}},
		{w.factory.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.nodeSeen, UpdateFunc: func(_, o any) { w.nodeSeen(o) }, DeleteFunc: w.nodeGone,
		}},
	}
	if err := startWatch(ctx, w.factory, "attachment watch", handlers); err != nil {
		return nil, err
	}
	return w, nil
}

// Violations are the moments a single-node volume was attached to two
// nodes, in the order seen.
func (w *AttachmentWatch) Violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.violations)
}

// Err is nil, or an error listing the violations.
func (w *AttachmentWatch) Err() error {
	v := w.Violations()
	if len(v) == 0 {
		return nil
	}
	return errors.New("a single-node volume attached to two nodes at once:\n  " + strings.Join(v, "\n  "))
}

// MaxNodes is the most nodes the volume was attached to at once by
// VolumeAttachments since the watch started: 1 for a volume that moved
// safely. volume is its PV's name (an inline volume: DRIVER^HANDLE).
func (w *AttachmentWatch) MaxNodes(volume string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxNodes[volume]
}

// Volumes are the volumes seen attached (MaxNodes' keys), sorted.
func (w *AttachmentWatch) Volumes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Sorted(maps.Keys(w.maxNodes))
}

func (w *AttachmentWatch) violation(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf("%6.2fs ", time.Since(w.started).Seconds())+fmt.Sprintf(format, args...))
}

// singleNode says whether the PV may be attached to one node only.
func (w *AttachmentWatch) singleNode(pv string) bool {
	p, ok := w.pvs[pv]
	if !ok {
		return true
	}
	return !slices.ContainsFunc(p.Spec.AccessModes, func(m v1.PersistentVolumeAccessMode) bool {
		return m == v1.ReadWriteMany || m == v1.ReadOnlyMany
	}) && len(p.Spec.AccessModes) > 0
}

func (w *AttachmentWatch) pvSeen(obj any) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pvs[pv.Name] = pv
	if c := pv.Spec.CSI; c != nil {
		w.pvOfName["kubernetes.io/csi/"+c.Driver+"^"+c.VolumeHandle] = pv.Name
	}
}

// vaVolume is the volume a VolumeAttachment attaches: its PV, or
// DRIVER^HANDLE of an inline volume.
func vaVolume(va *storagev1.VolumeAttachment) string {
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		return *pv
	}
	if s := va.Spec.Source.InlineVolumeSpec; s != nil && s.CSI != nil {
		return s.CSI.Driver + "^" + s.CSI.VolumeHandle
	}
	return va.Name
}

func (w *AttachmentWatch) vaSeen(obj any) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.vas[va.Name] = va
	w.checkVolume(vaVolume(va))
}

func (w *AttachmentWatch) vaGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.vas, va.Name)
	w.checkVolume(vaVolume(va))
}

// checkVolume judges the VolumeAttachments of volume. Called with mu held.
func (w *AttachmentWatch) checkVolume(volume string) {
	var nodes []string
	for _, va := range w.vas {
		if vaVolume(va) == volume && !slices.Contains(nodes, va.Spec.NodeName) {
			nodes = append(nodes, va.Spec.NodeName)
		}
	}
	w.maxNodes[volume] = max(w.maxNodes[volume], len(nodes))
	slices.Sort(nodes)
	w.judge("va "+volume, len(nodes) > 1 && w.singleNode(volume),
		"volume %s has VolumeAttachments on nodes %s", volume, strings.Join(nodes, ", "))
}

// judge records a violation when one starts. Called with mu held.
func (w *AttachmentWatch) judge(key string, violated bool, format string, args ...any) {
	switch {
	case !violated:
		delete(w.active, key)
	case !w.active[key]:
		w.active[key] = true
		w.violation(format, args...)
	}
}

func (w *AttachmentWatch) nodeSeen(obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	names := make([]string, 0, len(node.Status.VolumesAttached))
	for _, a := range node.Status.VolumesAttached {
		names = append(names, string(a.Name))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	previous := w.listed[node.Name]
	w.listed[node.Name] = names
	for _, name := range append(names, previous...) {
		w.checkListed(name)
	}
}

// checkListed judges the nodes whose volumesAttached list name. Called
// with mu held.
func (w *AttachmentWatch) checkListed(name string) {
	var on []string
	for n, l := range w.listed {
		if slices.Contains(l, name) {
			on = append(on, n)
		}
	}
	slices.Sort(on)
	pv, known := w.pvOfName[name]
	w.judge("listed "+name, len(on) > 1 && (!known || w.singleNode(pv)),
		"volume %s listed in volumesAttached of nodes %s", name, strings.Join(on, ", "))
}

func (w *AttachmentWatch) nodeGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if node, ok := obj.(*v1.Node); ok {
		w.mu.Lock()
		defer w.mu.Unlock()
		previous := w.listed[node.Name]
		delete(w.listed, node.Name)
		for _, name := range previous {
			w.checkListed(name)
		}
	}
}

// watchHandler is an informer and the handler a watch adds to it.
type watchHandler struct {
	informer cache.SharedIndexInformer
	handler  cache.ResourceEventHandlerFuncs
}

// startWatch adds handlers to their informers, starts factory and returns
// once every cache is synced; the factory shuts down when ctx ends. what
// names the watch in errors.
func startWatch(ctx context.Context, factory informers.SharedInformerFactory, what string, handlers []watchHandler) error {
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			factory.Shutdown()
			return fmt.Errorf("%s: cache of %v not synced: %w", what, typ, context.Cause(ctx))
		}
	}
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	return nil
}
