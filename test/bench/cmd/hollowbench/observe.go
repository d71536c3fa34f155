package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// podTimes are the moments one pod's start is made of, each the first time
// the bench's watch saw it.
type podTimes struct {
	node   string
	volume v1.UniqueVolumeName
	va     string

	created    time.Time // just before the create request was sent
	vaAttached time.Time // the VolumeAttachment's status.attached (the attacher)
	listed     time.Time // the node's volumesAttached lists the volume (the controller)
	running    time.Time // phase Running (the kubelet mounted the volume)
	deleted    time.Time // just before the delete request was sent
	vaGone     time.Time // the VolumeAttachment deleted (detached)
}

// observer records podTimes from watches on the run's pods, the nodes and
// the VolumeAttachments. Times are taken when an event arrives, as
// ClusterLoader2's pod-startup measurement takes "watch" time.
type observer struct {
	mu   sync.Mutex
	pods map[string]*podTimes // by pod name
	byVA map[string]*podTimes
	// byNode are the pods of each node, for its volumesAttached.
	byNode map[string][]*podTimes
}

func newObserver() *observer {
	return &observer{pods: map[string]*podTimes{}, byVA: map[string]*podTimes{}, byNode: map[string][]*podTimes{}}
}

// expect registers a pod before it is created.
func (o *observer) expect(name string, t *podTimes) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pods[name] = t
	o.byVA[t.va] = t
	o.byNode[t.node] = append(o.byNode[t.node], t)
}

func (o *observer) set(at *time.Time, now time.Time) {
	if at.IsZero() {
		*at = now
	}
}

func (o *observer) pod(p *v1.Pod) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if t := o.pods[p.Name]; t != nil && p.Status.Phase == v1.PodRunning {
		o.set(&t.running, now)
	}
}

func (o *observer) node(n *v1.Node) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, t := range o.byNode[n.Name] {
		if slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == t.volume }) {
			o.set(&t.listed, now)
		}
	}
}

func (o *observer) va(va *storagev1.VolumeAttachment, gone bool) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.byVA[va.Name]
	switch {
	case t == nil:
	case gone && !t.deleted.IsZero():
		o.set(&t.vaGone, now)
	case va.Status.Attached:
		o.set(&t.vaAttached, now)
	}
}

// count returns how many pods satisfy f.
func (o *observer) count(f func(*podTimes) bool) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, t := range o.pods {
		if f(t) {
			n++
		}
	}
	return n
}

// snapshot returns a copy of every pod's times.
func (o *observer) snapshot() []podTimes {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]podTimes, 0, len(o.pods))
	for _, t := range o.pods {
		out = append(out, *t)
	}
	return out
}

// watch starts informers on the namespace's pods, the nodes and the
// VolumeAttachments feeding o, and returns once they are synced; they stop
// with ctx.
func (o *observer) watch(ctx context.Context, client kubernetes.Interface, ns string) error {
	all := informers.NewSharedInformerFactory(client, 0)
	inNS := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	podHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.pod(obj.(*v1.Pod)) },
		UpdateFunc: func(_, obj any) { o.pod(obj.(*v1.Pod)) },
	}
	nodeHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.node(obj.(*v1.Node)) },
		UpdateFunc: func(_, obj any) { o.node(obj.(*v1.Node)) },
	}
	vaHandler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { o.va(obj.(*storagev1.VolumeAttachment), false) },
		UpdateFunc: func(_, obj any) { o.va(obj.(*storagev1.VolumeAttachment), false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if va, ok := obj.(*storagev1.VolumeAttachment); ok {
				o.va(va, true)
			}
		},
	}
	// Handlers are registered before Start: no event is missed.
	for _, h := range []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
	}{
		{inNS.Core().V1().Pods().Informer(), podHandler},
		{all.Core().V1().Nodes().Informer(), nodeHandler},
		{all.Storage().V1().VolumeAttachments().Informer(), vaHandler},
	} {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
	}
	all.Start(ctx.Done())
	inNS.Start(ctx.Done())
	all.WaitForCacheSync(ctx.Done())
	inNS.WaitForCacheSync(ctx.Done())
	return ctx.Err()
}
