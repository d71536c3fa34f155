package integration

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// Records of what the API server saw, from watches the test opens itself,
// to judge the safety invariants on: a disk never on two nodes, no detach
// started while node status lists the volume.

// diskWatch records, from the moment it starts, every VolumeAttachment of a
// set of PVs, each naming a disk (several PVs may name one), and every
// moment one disk had VolumeAttachments on two nodes (one being deleted
// counts: it may still be attached).
type diskWatch struct {
	disks map[string]string // PV -> disk
	mu    sync.Mutex
	live  map[string]map[string]string // disk -> VolumeAttachment -> node
	nodes map[string]bool              // every node a VolumeAttachment was seen for
	bad   []string
}

func (e *env) watchDisk(disks map[string]string) *diskWatch {
	e.t.Helper()
	dw := &diskWatch{disks: disks, live: map[string]map[string]string{}, nodes: map[string]bool{}}
	e.watchAttachments(func(typ watch.EventType, va *storagev1.VolumeAttachment) {
		dw.observe(typ, va)
	}, func(err string) {
		dw.mu.Lock()
		dw.bad = append(dw.bad, err)
		dw.mu.Unlock()
	})
	return dw
}

func (dw *diskWatch) observe(typ watch.EventType, va *storagev1.VolumeAttachment) {
	src := va.Spec.Source.PersistentVolumeName
	if src == nil {
		return
	}
	disk, ok := dw.disks[*src]
	if !ok {
		return
	}
	dw.mu.Lock()
	defer dw.mu.Unlock()
	live := dw.live[disk]
	if live == nil {
		live = map[string]string{}
		dw.live[disk] = live
	}
	if typ == watch.Deleted {
		delete(live, va.Name)
		return
	}
	live[va.Name] = va.Spec.NodeName
	dw.nodes[va.Spec.NodeName] = true
	var nodes []string
	for _, n := range live {
		if !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) > 1 {
		slices.Sort(nodes)
		dw.bad = append(dw.bad, fmt.Sprintf("disk %s had VolumeAttachments on %v at resourceVersion %s", disk, nodes, va.ResourceVersion))
	}
}

// violations is an error naming every moment a disk was on two nodes.
func (dw *diskWatch) violations() error {
	dw.mu.Lock()
	defer dw.mu.Unlock()
	if len(dw.bad) > 0 {
		return fmt.Errorf("%s", strings.Join(dw.bad, "; "))
	}
	return nil
}

// watchAttachments lists the VolumeAttachments, then watches them from
// that list on until the test ends, passing every object and event to
// observe; an ended watch is reported to fail.
func (e *env) watchAttachments(observe func(watch.EventType, *storagev1.VolumeAttachment), fail func(string)) {
	e.t.Helper()
	list, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range list.Items {
		observe(watch.Added, &list.Items[i])
	}
	done := make(chan struct{})
	stopped := false
	var mu sync.Mutex
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			va, ok := ev.Object.(*storagev1.VolumeAttachment)
			if !ok {
				fail(fmt.Sprintf("VolumeAttachment watch: %s event %v", ev.Type, ev.Object))
				continue
			}
			observe(ev.Type, va)
		}
		mu.Lock()
		if !stopped {
			fail("VolumeAttachment watch ended early")
		}
		mu.Unlock()
	}()
	e.t.Cleanup(func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		w.Stop()
		<-done
	})
}

// statusWatch records every version of a node and every event of the
// VolumeAttachments of some PVs, to replay them in the order etcd wrote
// them (by resourceVersion).
type statusWatch struct {
	node    string
	volumes map[string]string // PV -> volume name in node status
	mu      sync.Mutex
	events  []statusEvent
	bad     []string
}

type statusEvent struct {
	rv   uint64
	typ  watch.EventType
	node *v1.Node
	va   *storagev1.VolumeAttachment
}

func (e *env) watchStatusAndAttachments(node string, volumes map[string]string) *statusWatch {
	e.t.Helper()
	sw := &statusWatch{node: node, volumes: volumes}
	fail := func(err string) {
		sw.mu.Lock()
		sw.bad = append(sw.bad, err)
		sw.mu.Unlock()
	}
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	sw.record(statusEvent{typ: watch.Added, node: n})
	w, err := e.client.CoreV1().Nodes().Watch(e.ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", node).String(),
		ResourceVersion: n.ResourceVersion,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*v1.Node); ok {
				sw.record(statusEvent{typ: ev.Type, node: n})
			} else {
				fail(fmt.Sprintf("node watch: %s event %v", ev.Type, ev.Object))
			}
		}
	}()
	e.t.Cleanup(func() {
		w.Stop()
		<-done
	})
	e.watchAttachments(func(typ watch.EventType, va *storagev1.VolumeAttachment) {
		if src := va.Spec.Source.PersistentVolumeName; src != nil && volumes[*src] != "" {
			sw.record(statusEvent{typ: typ, va: va})
		}
	}, fail)
	return sw
}

func (sw *statusWatch) record(ev statusEvent) {
	if ev.node != nil {
		ev.rv, _ = strconv.ParseUint(ev.node.ResourceVersion, 10, 64)
	} else {
		ev.rv, _ = strconv.ParseUint(ev.va.ResourceVersion, 10, 64)
	}
	sw.mu.Lock()
	sw.events = append(sw.events, ev)
	sw.mu.Unlock()
}

// detachesWhileListed is an error naming every detach the controller
// started (the delete of a VolumeAttachment through p) while the node's
// status, as last written before it, listed the volume.
func (sw *statusWatch) detachesWhileListed(p *apiProxy) error {
	sw.mu.Lock()
	events := slices.Clone(sw.events)
	out := slices.Clone(sw.bad)
	sw.mu.Unlock()
	sort.SliceStable(events, func(i, j int) bool { return events[i].rv < events[j].rv })
	var node *v1.Node
	vas := map[string]*storagev1.VolumeAttachment{}
	for _, ev := range events {
		if ev.node != nil {
			node = ev.node
			continue
		}
		va := ev.va
		prev := vas[va.Name]
		starting := va.DeletionTimestamp != nil && (prev == nil || prev.UID != va.UID || prev.DeletionTimestamp == nil)
		if ev.typ == watch.Deleted {
			starting = prev == nil || prev.UID != va.UID || prev.DeletionTimestamp == nil
			delete(vas, va.Name)
		} else {
			vas[va.Name] = va
		}
		if !starting || !p.deletedByController(va.UID) || node == nil {
			continue
		}
		volume := sw.volumes[*va.Spec.Source.PersistentVolumeName]
		if slices.Contains(attachedNames(node), volume) {
			out = append(out, fmt.Sprintf("the controller deleted VolumeAttachment %s (resourceVersion %d) while node %s status listed %s (node resourceVersion %s)",
				va.Name, ev.rv, sw.node, volume, node.ResourceVersion))
		}
	}
	if len(out) > 0 {
		return fmt.Errorf("%s", strings.Join(out, "; "))
	}
	return nil
}
