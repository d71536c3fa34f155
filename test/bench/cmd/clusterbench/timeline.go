package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// selectedNodeAnnotation is what kube-scheduler writes on a
// WaitForFirstConsumer claim once it has chosen its pod's node: the
// provisioner creates the volume in that node's zone.
const selectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// podFacts are the moments of one pod (one UID), each the first time a
// watch saw it.
type podFacts struct {
	name string
	uid  types.UID
	node string

	created  time.Time // the StatefulSet controller created it
	onNode   time.Time // spec.nodeName set: kube-scheduler bound it
	running  time.Time // phase Running: the kubelet mounted its volume
	deleting time.Time // deletionTimestamp set: evicted or deleted
	gone     time.Time // removed from the API
}

// claimFacts are the moments of one claim.
type claimFacts struct {
	selected time.Time // kube-scheduler's selected-node annotation
	bound    time.Time // phase Bound: the PV controller bound it
	volume   string
}

// pvFacts are a PersistentVolume's.
type pvFacts struct {
	created time.Time // the external-provisioner created it
	claim   string    // namespace/name
	unique  string    // kubernetes.io/csi/DRIVER^HANDLE, as node status names it
}

// vaKey is a VolumeAttachment's volume and node: the name is a hash of
// them, and both controllers give the same one.
type vaKey struct{ pv, node string }

// vaFacts are a VolumeAttachment's.
type vaFacts struct {
	created  time.Time // the attach/detach controller created it
	attached time.Time // status.attached: the external-attacher attached it
	deleting time.Time // deletionTimestamp: the attach/detach controller detaches it
	gone     time.Time // the external-attacher detached it and let it go
}

// nodeVolume is a volume in one node's status.
type nodeVolume struct{ node, unique string }

// nodeVolumeFacts are a volume's moments in one node's status.
type nodeVolumeFacts struct {
	listed   time.Time // in volumesAttached: the attach/detach controller reported it
	unlisted time.Time // out of volumesAttached again
	inUse    time.Time // in volumesInUse: the kubelet means to mount it
	unused   time.Time // out of volumesInUse again: the kubelet unmounted it
}

// timeline records what the bench's watches see of one cluster's pods,
// claims, volumes, VolumeAttachments and node statuses, each moment the
// first time an event shows it (ClusterLoader2's "watch time"). The
// spans of the report are computed from it afterwards.
type timeline struct {
	mu     sync.Mutex
	pods   map[types.UID]*podFacts
	claims map[string]*claimFacts // namespace/name
	pvs    map[string]*pvFacts
	vas    map[vaKey]*vaFacts
	nodes  map[nodeVolume]*nodeVolumeFacts
	// attached and inUse are each node's lists as last seen.
	attached map[string]map[string]bool
	inUse    map[string]map[string]bool
}

func newTimeline() *timeline {
	return &timeline{
		pods:     map[types.UID]*podFacts{},
		claims:   map[string]*claimFacts{},
		pvs:      map[string]*pvFacts{},
		vas:      map[vaKey]*vaFacts{},
		nodes:    map[nodeVolume]*nodeVolumeFacts{},
		attached: map[string]map[string]bool{},
		inUse:    map[string]map[string]bool{},
	}
}

// first sets *at to now unless it is set.
func first(at *time.Time, now time.Time) {
	if at.IsZero() {
		*at = now
	}
}

func (t *timeline) pod(p *v1.Pod, gone bool, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.pods[p.UID]
	if f == nil {
		f = &podFacts{name: p.Name, uid: p.UID}
		t.pods[p.UID] = f
		first(&f.created, now)
	}
	if p.Spec.NodeName != "" {
		f.node = p.Spec.NodeName
		first(&f.onNode, now)
	}
	if p.Status.Phase == v1.PodRunning {
		first(&f.running, now)
	}
	if p.DeletionTimestamp != nil {
		first(&f.deleting, now)
	}
	if gone {
		first(&f.deleting, now)
		first(&f.gone, now)
	}
}

func (t *timeline) claim(c *v1.PersistentVolumeClaim, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := c.Namespace + "/" + c.Name
	f := t.claims[key]
	if f == nil {
		f = &claimFacts{}
		t.claims[key] = f
	}
	if c.Annotations[selectedNodeAnnotation] != "" {
		first(&f.selected, now)
	}
	if c.Status.Phase == v1.ClaimBound {
		first(&f.bound, now)
		f.volume = c.Spec.VolumeName
	}
}

func (t *timeline) pv(pv *v1.PersistentVolume, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.pvs[pv.Name]
	if f == nil {
		f = &pvFacts{}
		t.pvs[pv.Name] = f
		first(&f.created, now)
	}
	if r := pv.Spec.ClaimRef; r != nil {
		f.claim = r.Namespace + "/" + r.Name
	}
	if csi := pv.Spec.CSI; csi != nil {
		f.unique = "kubernetes.io/csi/" + csi.Driver + "^" + csi.VolumeHandle
	}
}

func (t *timeline) va(va *storagev1.VolumeAttachment, gone bool, now time.Time) {
	pv := va.Spec.Source.PersistentVolumeName
	if pv == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	key := vaKey{*pv, va.Spec.NodeName}
	f := t.vas[key]
	if f == nil {
		f = &vaFacts{}
		t.vas[key] = f
		first(&f.created, now)
	}
	if va.Status.Attached {
		first(&f.attached, now)
	}
	if va.DeletionTimestamp != nil {
		first(&f.deleting, now)
	}
	if gone {
		first(&f.deleting, now)
		first(&f.gone, now)
	}
}

// node records the volumes that entered or left the node's
// volumesAttached and volumesInUse since its last event.
func (t *timeline) node(n *v1.Node, now time.Time) {
	attached := map[string]bool{}
	for _, a := range n.Status.VolumesAttached {
		attached[string(a.Name)] = true
	}
	inUse := map[string]bool{}
	for _, u := range n.Status.VolumesInUse {
		inUse[string(u)] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.diff(n.Name, t.attached[n.Name], attached, now,
		func(f *nodeVolumeFacts) *time.Time { return &f.listed },
		func(f *nodeVolumeFacts) *time.Time { return &f.unlisted })
	t.diff(n.Name, t.inUse[n.Name], inUse, now,
		func(f *nodeVolumeFacts) *time.Time { return &f.inUse },
		func(f *nodeVolumeFacts) *time.Time { return &f.unused })
	t.attached[n.Name], t.inUse[n.Name] = attached, inUse
}

// diff records, for the volumes in one of the node's lists, when each
// came in (a volume's first entry) and left (its first exit after that).
func (t *timeline) diff(node string, before, after map[string]bool, now time.Time, in, out func(*nodeVolumeFacts) *time.Time) {
	for u := range after {
		if !before[u] {
			first(in(t.nodeVolume(node, u)), now)
		}
	}
	for u := range before {
		if f := t.nodeVolume(node, u); !after[u] && !in(f).IsZero() {
			first(out(f), now)
		}
	}
}

func (t *timeline) nodeVolume(node, unique string) *nodeVolumeFacts {
	k := nodeVolume{node, unique}
	f := t.nodes[k]
	if f == nil {
		f = &nodeVolumeFacts{}
		t.nodes[k] = f
	}
	return f
}

// watch starts informers on the namespace's pods and claims, and on every
// PV, VolumeAttachment and node, feeding t, and returns once they are
// synced; they stop with ctx. Handlers are registered before the
// informers start: no event is missed.
func (t *timeline) watch(ctx context.Context, client kubernetes.Interface, ns string) error {
	all := informers.NewSharedInformerFactory(client, 0)
	inNS := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	handler := func(record func(obj any, gone bool, now time.Time)) cache.ResourceEventHandler {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { record(obj, false, time.Now()) },
			UpdateFunc: func(_, obj any) { record(obj, false, time.Now()) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				record(obj, true, time.Now())
			},
		}
	}
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		record   func(obj any, gone bool, now time.Time)
	}{
		{inNS.Core().V1().Pods().Informer(), func(obj any, gone bool, now time.Time) {
			if p, ok := obj.(*v1.Pod); ok {
				t.pod(p, gone, now)
			}
		}},
		{inNS.Core().V1().PersistentVolumeClaims().Informer(), func(obj any, _ bool, now time.Time) {
			if c, ok := obj.(*v1.PersistentVolumeClaim); ok {
				t.claim(c, now)
			}
		}},
		{all.Core().V1().PersistentVolumes().Informer(), func(obj any, _ bool, now time.Time) {
			if pv, ok := obj.(*v1.PersistentVolume); ok {
				t.pv(pv, now)
			}
		}},
		{all.Storage().V1().VolumeAttachments().Informer(), func(obj any, gone bool, now time.Time) {
			if va, ok := obj.(*storagev1.VolumeAttachment); ok {
				t.va(va, gone, now)
			}
		}},
		{all.Core().V1().Nodes().Informer(), func(obj any, gone bool, now time.Time) {
			if n, ok := obj.(*v1.Node); ok && !gone {
				t.node(n, now)
			}
		}},
	} {
		if _, err := h.informer.AddEventHandler(handler(h.record)); err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
	}
	all.Start(ctx.Done())
	inNS.Start(ctx.Done())
	for typ, ok := range all.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("cache of %v not synced: %w", typ, context.Cause(ctx))
		}
	}
	for typ, ok := range inNS.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("cache of %v not synced: %w", typ, context.Cause(ctx))
		}
	}
	return nil
}

// count returns how many pods satisfy f.
func (t *timeline) count(f func(*podFacts) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, p := range t.pods {
		if f(p) {
			n++
		}
	}
	return n
}

// countVAs returns how many VolumeAttachments satisfy f.
func (t *timeline) countVAs(f func(vaKey, *vaFacts) bool) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, va := range t.vas {
		if f(k, va) {
			n++
		}
	}
	return n
}
