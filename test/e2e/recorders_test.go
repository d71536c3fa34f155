package e2e

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// vaRecorder watches VolumeAttachments from its start and records what
// happened to each: the UIDs it had, whether it was ever marked for deletion
// or deleted, and how many were live at once per PersistentVolume.
type vaRecorder struct {
	mu      sync.Mutex
	uids    map[string][]types.UID
	deleted map[string]bool   // deletionTimestamp seen, or deleted
	live    map[string]string // not being deleted: name -> PV
	maxLive map[string]int    // per PV
	err     error
}

// recordVolumeAttachments starts a vaRecorder that stops with the test.
func (e *env) recordVolumeAttachments() *vaRecorder {
	e.t.Helper()
	r := &vaRecorder{
		uids: map[string][]types.UID{}, deleted: map[string]bool{},
		live: map[string]string{}, maxLive: map[string]int{},
	}
	list, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatalf("list VolumeAttachments: %v", err)
	}
	for i := range list.Items {
		r.observe(watch.Added, &list.Items[i])
	}
	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		e.t.Fatalf("watch VolumeAttachments: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			va, ok := ev.Object.(*storagev1.VolumeAttachment)
			if !ok {
				r.mu.Lock()
				r.err = fmt.Errorf("watch VolumeAttachments: unexpected %s event %T: %+v", ev.Type, ev.Object, ev.Object)
				r.mu.Unlock()
				return
			}
			r.observe(ev.Type, va)
		}
	}()
	e.t.Cleanup(func() {
		w.Stop()
		<-done
	})
	return r
}

func (r *vaRecorder) observe(typ watch.EventType, va *storagev1.VolumeAttachment) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if uids := r.uids[va.Name]; len(uids) == 0 || uids[len(uids)-1] != va.UID {
		r.uids[va.Name] = append(uids, va.UID)
	}
	if typ == watch.Deleted || va.DeletionTimestamp != nil {
		r.deleted[va.Name] = true
		delete(r.live, va.Name)
		return
	}
	pv := ""
	if va.Spec.Source.PersistentVolumeName != nil {
		pv = *va.Spec.Source.PersistentVolumeName
	}
	r.live[va.Name] = pv
	n := 0
	for _, other := range r.live {
		if other == pv {
			n++
		}
	}
	r.maxLive[pv] = max(r.maxLive[pv], n)
}

// check fails the test if the watch broke: what it recorded is incomplete.
func (r *vaRecorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatal(r.err)
	}
}

// wasDeleted says whether the VolumeAttachment name was marked for deletion
// or deleted since the recorder started.
func (r *vaRecorder) wasDeleted(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deleted[name]
}

// uidsOf returns the UIDs name had, in order.
func (r *vaRecorder) uidsOf(name string) []types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.uids[name])
}

// maxLiveOf is the most VolumeAttachments of PV pv live at the same time.
func (r *vaRecorder) maxLiveOf(pv string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxLive[pv]
}

// statusRecorder watches the test's nodes from its start and records every
// volume ever removed from a node's status.volumesAttached: the controller's
// first step of a detach, after which kubelet stops mounting it.
type statusRecorder struct {
	mu      sync.Mutex
	last    map[string][]string        // node -> volumesAttached last seen
	removed map[string]map[string]bool // node -> volume -> removed
	err     error
}

// recordNodeStatus starts a statusRecorder that stops with the test.
func (e *env) recordNodeStatus() *statusRecorder {
	e.t.Helper()
	r := &statusRecorder{last: map[string][]string{}, removed: map[string]map[string]bool{}}
	list, err := e.client.CoreV1().Nodes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatalf("list nodes: %v", err)
	}
	for i := range list.Items {
		r.observe(&list.Items[i])
	}
	w, err := e.client.CoreV1().Nodes().Watch(e.ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		e.t.Fatalf("watch nodes: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			node, ok := ev.Object.(*v1.Node)
			if !ok {
				r.mu.Lock()
				r.err = fmt.Errorf("watch nodes: unexpected %s event %T: %+v", ev.Type, ev.Object, ev.Object)
				r.mu.Unlock()
				return
			}
			r.observe(node)
		}
	}()
	e.t.Cleanup(func() {
		w.Stop()
		<-done
	})
	return r
}

func (r *statusRecorder) observe(node *v1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var now []string
	for _, a := range node.Status.VolumesAttached {
		now = append(now, string(a.Name))
	}
	for _, v := range r.last[node.Name] {
		if !slices.Contains(now, v) {
			if r.removed[node.Name] == nil {
				r.removed[node.Name] = map[string]bool{}
			}
			r.removed[node.Name][v] = true
		}
	}
	r.last[node.Name] = now
}

// check fails the test if the watch broke: what it recorded is incomplete.
func (r *statusRecorder) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		t.Fatal(r.err)
	}
}

// wasRemoved says whether volume was removed from node's volumesAttached
// since the recorder started.
func (r *statusRecorder) wasRemoved(node, volume string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.removed[node][volume]
}
