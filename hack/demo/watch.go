package main

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// watcher logs every change the demo's components make, as it happens:
// VolumeAttachments (the controller creates and deletes them, csi-attacher
// attaches and detaches), node status (the controller writes
// volumesAttached, kubelet volumesInUse), cordons, claims and the
// PersistentVolumes csi-provisioner creates, pods, and the events of the
// scheduler and the controller on pods.
type watcher struct {
	p         *printer
	nodes     sets.Set[string]
	stopCh    chan struct{}
	factories []informers.SharedInformerFactory
}

// startWatcher starts the informers and returns once their caches are
// synced; what exists by then is not logged. Call stop when done.
func startWatcher(client kubernetes.Interface, p *printer, ns string, nodes []string) (*watcher, error) {
	w := &watcher{p: p, nodes: sets.New(nodes...), stopCh: make(chan struct{})}
	cluster := informers.NewSharedInformerFactory(client, 0)
	namespaced := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	w.factories = []informers.SharedInformerFactory{cluster, namespaced}
	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandlerFuncs
	}{
		{cluster.Storage().V1().VolumeAttachments().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.vaAdded, UpdateFunc: w.vaUpdated, DeleteFunc: w.vaDeleted,
		}},
		{cluster.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{UpdateFunc: w.nodeUpdated}},
		{namespaced.Core().V1().Pods().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.podAdded, UpdateFunc: w.podUpdated, DeleteFunc: w.podDeleted,
		}},
		{namespaced.Core().V1().Events().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: w.eventAdded}},
		{namespaced.Core().V1().PersistentVolumeClaims().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.claimAdded, UpdateFunc: w.claimUpdated,
		}},
		{cluster.Core().V1().PersistentVolumes().Informer(), cache.ResourceEventHandlerFuncs{AddFunc: w.pvAdded}},
	}
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return nil, fmt.Errorf("add event handler: %w", err)
		}
	}
	for _, f := range w.factories {
		f.Start(w.stopCh)
	}
	for _, f := range w.factories {
		for typ, ok := range f.WaitForCacheSync(w.stopCh) {
			if !ok {
				w.stop()
				return nil, fmt.Errorf("cache of %v did not sync", typ)
			}
		}
	}
	return w, nil
}

// stop stops the informers and waits for them.
func (w *watcher) stop() {
	close(w.stopCh)
	for _, f := range w.factories {
		f.Shutdown()
	}
}

// Annotations of the PV controller and csi-provisioner.
const (
	selectedNodeAnnotation  = "volume.kubernetes.io/selected-node"
	provisionedByAnnotation = "pv.kubernetes.io/provisioned-by"
)

func unwrap(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

// describeVA names what a VolumeAttachment attaches, where.
func describeVA(va *storagev1.VolumeAttachment) string {
	what := "an inline volume"
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		what = "PV " + *pv
	}
	return fmt.Sprintf("%s on %s (%s, attacher %s)", what, va.Spec.NodeName, shortName(va.Name), va.Spec.Attacher)
}

// shortName abbreviates a VolumeAttachment name (csi-<64 hex digits>).
func shortName(name string) string {
	if len(name) > 14 {
		return name[:14] + "…"
	}
	return name
}

func (w *watcher) vaAdded(obj any) {
	if va, ok := obj.(*storagev1.VolumeAttachment); ok {
		w.p.event(yellow, "attach", "controller created VolumeAttachment for %s", describeVA(va))
	}
}

func (w *watcher) vaUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*storagev1.VolumeAttachment)
	va, ok2 := newObj.(*storagev1.VolumeAttachment)
	if !ok1 || !ok2 {
		return
	}
	if !old.Status.Attached && va.Status.Attached {
		w.p.event(green, "attached", "csi-attacher attached %s", describeVA(va))
	}
	if e := va.Status.AttachError; e != nil && (old.Status.AttachError == nil || old.Status.AttachError.Message != e.Message) {
		w.p.event(red, "attach error", "%s: %s", describeVA(va), e.Message)
	}
	if old.DeletionTimestamp == nil && va.DeletionTimestamp != nil {
		w.p.event(yellow, "detach", "controller deleted the VolumeAttachment for %s; csi-attacher detaches it", describeVA(va))
	}
	if e := va.Status.DetachError; e != nil && (old.Status.DetachError == nil || old.Status.DetachError.Message != e.Message) {
		w.p.event(red, "detach error", "%s: %s", describeVA(va), e.Message)
	}
}

func (w *watcher) vaDeleted(obj any) {
	if va, ok := unwrap(obj).(*storagev1.VolumeAttachment); ok {
		w.p.event(green, "detached", "VolumeAttachment gone (csi-attacher removed its finalizer): %s", describeVA(va))
	}
}

func (w *watcher) nodeUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*v1.Node)
	node, ok2 := newObj.(*v1.Node)
	if !ok1 || !ok2 || !w.nodes.Has(node.Name) {
		return
	}
	if !old.Spec.Unschedulable && node.Spec.Unschedulable {
		w.p.event(yellow, "cordon", "%s cordoned: no new pod is scheduled there", node.Name)
	}
	if old.Spec.Unschedulable && !node.Spec.Unschedulable {
		w.p.event(yellow, "uncordon", "%s schedulable again", node.Name)
	}
	added, removed := diff(attachedNames(old), attachedNames(node))
	for _, n := range added {
		w.p.event(cyan, "node status", "controller added %s to %s status.volumesAttached", n, node.Name)
	}
	for _, n := range removed {
		w.p.event(cyan, "node status", "controller removed %s from %s status.volumesAttached", n, node.Name)
	}
	added, removed = diff(inUseNames(old), inUseNames(node))
	for _, n := range added {
		w.p.event(cyan, "in use", "kubelet of %s reports %s in use (status.volumesInUse): it mounts it once the controller lists it attached", node.Name, n)
	}
	for _, n := range removed {
		w.p.event(cyan, "unmounted", "kubelet of %s unmounted %s (gone from status.volumesInUse)", node.Name, n)
	}
}

func attachedNames(node *v1.Node) []string {
	var names []string
	for _, a := range node.Status.VolumesAttached {
		names = append(names, string(a.Name))
	}
	return names
}

func inUseNames(node *v1.Node) []string {
	var names []string
	for _, n := range node.Status.VolumesInUse {
		names = append(names, string(n))
	}
	return names
}

// diff returns what is in b and not in a, and what is in a and not in b,
// sorted.
func diff(a, b []string) (added, removed []string) {
	as, bs := sets.New(a...), sets.New(b...)
	return sets.List(bs.Difference(as)), sets.List(as.Difference(bs))
}

func claimsOf(pod *v1.Pod) []string {
	var claims []string
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims = append(claims, v.PersistentVolumeClaim.ClaimName)
		}
	}
	slices.Sort(claims)
	return claims
}

func (w *watcher) podAdded(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	if pod.Spec.NodeName == "" {
		by := "a user"
		if o := metav1.GetControllerOf(pod); o != nil {
			by = o.Kind + " " + o.Name
		}
		w.p.event("", "pod", "%s/%s created by %s, claims %s: the scheduler picks its node", pod.Namespace, pod.Name, by, strings.Join(claimsOf(pod), ", "))
		return
	}
	w.p.event("", "pod", "%s/%s created on %s, claims %s", pod.Namespace, pod.Name, pod.Spec.NodeName, strings.Join(claimsOf(pod), ", "))
}

func (w *watcher) claimAdded(obj any) {
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok || pvc.Spec.VolumeName != "" {
		return
	}
	class := ""
	if pvc.Spec.StorageClassName != nil {
		class = *pvc.Spec.StorageClassName
	}
	w.p.event("", "claim", "%s/%s created (StorageClass %s): its volume waits for its pod's node", pvc.Namespace, pvc.Name, class)
}

func (w *watcher) claimUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*v1.PersistentVolumeClaim)
	pvc, ok2 := newObj.(*v1.PersistentVolumeClaim)
	if !ok1 || !ok2 {
		return
	}
	if old.Annotations[selectedNodeAnnotation] == "" && pvc.Annotations[selectedNodeAnnotation] != "" {
		w.p.event("", "claim", "scheduler selected node %s for %s/%s: csi-provisioner creates its volume in that node's zone", pvc.Annotations[selectedNodeAnnotation], pvc.Namespace, pvc.Name)
	}
	// A claim pre-bound to an existing PV has its volumeName from the start.
	if old.Spec.VolumeName == "" && pvc.Spec.VolumeName != "" {
		w.p.event(green, "bound", "%s/%s bound to %s (PV controller)", pvc.Namespace, pvc.Name, pvc.Spec.VolumeName)
	}
}

func (w *watcher) pvAdded(obj any) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok || pv.Annotations[provisionedByAnnotation] == "" || pv.Spec.ClaimRef == nil {
		return
	}
	w.p.event(green, "provisioned", "%s created %s for %s/%s, in %s", pv.Annotations[provisionedByAnnotation], pv.Name, pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name, pvZone(pv))
}

func (w *watcher) podUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*v1.Pod)
	pod, ok2 := newObj.(*v1.Pod)
	if ok1 && ok2 && old.DeletionTimestamp == nil && pod.DeletionTimestamp != nil {
		w.p.event("", "pod", "%s/%s is being deleted", pod.Namespace, pod.Name)
	}
	if ok1 && ok2 && old.Status.Phase != v1.PodRunning && pod.Status.Phase == v1.PodRunning {
		w.p.event(green, "running", "%s/%s Running on %s: its kubelet mounted %s", pod.Namespace, pod.Name, pod.Spec.NodeName, strings.Join(claimsOf(pod), ", "))
	}
}

func (w *watcher) podDeleted(obj any) {
	if pod, ok := unwrap(obj).(*v1.Pod); ok {
		w.p.event("", "pod", "%s/%s deleted (its kubelet stopped it and unmounted its volumes)", pod.Namespace, pod.Name)
	}
}

func (w *watcher) eventAdded(obj any) {
	ev, ok := obj.(*v1.Event)
	if !ok || ev.InvolvedObject.Kind != "Pod" {
		return
	}
	colour := green
	if ev.Type == v1.EventTypeWarning {
		colour = red
	}
	w.p.event(colour, "event", "%s %s on pod %s/%s: %s", ev.Type, ev.Reason, ev.InvolvedObject.Namespace, ev.InvolvedObject.Name, ev.Message)
}
