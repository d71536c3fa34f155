package stack

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// DetachWatch watches, for as long as its context lives, the pods it
// protects and their volumes, and records every moment one was disturbed:
//
//   - the VolumeAttachment of a protected volume on its pod's node deleted,
//     being deleted (deletionTimestamp set), replaced (another UID) or no
//     longer attached (status.attached false);
//   - the volume dropped from that node's status.volumesAttached, once a
//     node event listed it after it was protected (an older event still in
//     flight when it was protected is no drop);
//   - the pod not Running or not Ready, being deleted, gone, or one of its
//     containers restarted.
//
// A cut-over, or anything else that must leave running pods alone, is
// judged by it: protect the pods that keep running (Protect, once each
// runs with its volumes attached), release a pod before deleting it
// (Release). Each source is judged on its own watch, an event at a time,
// so a drop that lasts one node status update is seen.
//
// It also records when each VolumeAttachment and each PersistentVolume
// started to be deleted and was deleted (Deletions), by resourceVersion:
// one etcd orders every write of the cluster, so two deletions compare.
type DetachWatch struct {
	client  kubernetes.Interface
	started time.Time

	mu sync.Mutex
	// pods are the protected pods by UID; volumes their volumes, by the
	// name of their VolumeAttachment.
	pods    map[types.UID]*protectedPod
	volumes map[string]*protectedVolume
	// listed is each node's volumesAttached as of its last event.
	listed     map[string][]v1.UniqueVolumeName
	violations []string
	// reported are the violations recorded, by key: each is recorded once.
	reported  map[string]bool
	deletions map[string]*Deletion

	factory informers.SharedInformerFactory
}

type protectedPod struct {
	namespace, name, node string
	restarts              int32
}

type protectedVolume struct {
	pod        types.UID
	podName    string // namespace/name
	pv, node   string
	attachment string
	uid        types.UID
	unique     v1.UniqueVolumeName
	// listed: a node event listed the volume since it was protected.
	listed bool
}

// Deletion is the deletion of one object as the watch saw it: the
// resourceVersion of the first write that set its deletionTimestamp
// (Started, 0 if the object went at once) and of its removal (Removed, 0
// while it exists).
type Deletion struct {
	Started, Removed uint64
	// RemovedAt is when the watch saw it removed.
	RemovedAt time.Time
}

// Deletion kinds.
const (
	KindVolumeAttachment = "VolumeAttachment"
	KindPersistentVolume = "PersistentVolume"
)

// WatchDetaches starts a DetachWatch and returns once its caches are
// synced. It stops when ctx ends.
func WatchDetaches(ctx context.Context, client kubernetes.Interface) (*DetachWatch, error) {
	w := newDetachWatch(client)
	w.factory = informers.NewSharedInformerFactory(client, 0)
	handlers := []watchHandler{
		{w.factory.Storage().V1().VolumeAttachments().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.vaSeen, UpdateFunc: func(_, o any) { w.vaSeen(o) }, DeleteFunc: w.vaGone,
		}},
		{w.factory.Core().V1().PersistentVolumes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.pvSeen, UpdateFunc: func(_, o any) { w.pvSeen(o) }, DeleteFunc: w.pvGone,
		}},
		{w.factory.Core().V1().Nodes().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.nodeSeen, UpdateFunc: func(_, o any) { w.nodeSeen(o) },
		}},
		{w.factory.Core().V1().Pods().Informer(), cache.ResourceEventHandlerFuncs{
			AddFunc: w.podSeen, UpdateFunc: func(_, o any) { w.podSeen(o) }, DeleteFunc: w.podGone,
		}},
	}
	if err := startWatch(ctx, w.factory, "detach watch", handlers); err != nil {
		return nil, err
	}
	return w, nil
}

func newDetachWatch(client kubernetes.Interface) *DetachWatch {
	return &DetachWatch{
		client:    client,
		started:   time.Now(),
		pods:      map[types.UID]*protectedPod{},
		volumes:   map[string]*protectedVolume{},
		listed:    map[string][]v1.UniqueVolumeName{},
		reported:  map[string]bool{},
		deletions: map[string]*Deletion{},
	}
}

// Protect starts guarding the pods, each Running on its node with every
// volume of its claims (PodClaims) attached there: each claim's PV is read
// from the API, its VolumeAttachment must exist and be attached.
func (w *DetachWatch) Protect(ctx context.Context, pods ...v1.Pod) error {
	for _, pod := range pods {
		var volumes []*protectedVolume
		for _, claimName := range PodClaims(&pod) {
			claim, err := w.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("protect pod %s/%s: %w", pod.Namespace, pod.Name, err)
			}
			pv, err := w.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("protect pod %s/%s: claim %s: %w", pod.Namespace, pod.Name, claimName, err)
			}
			if pv.Spec.CSI == nil {
				return fmt.Errorf("protect pod %s/%s: PV %s is not a CSI volume", pod.Namespace, pod.Name, pv.Name)
			}
			d, h := pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle
			name := framework.VolumeAttachmentName(h, d, pod.Spec.NodeName)
			va, err := w.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("protect pod %s/%s: PV %s: %w", pod.Namespace, pod.Name, pv.Name, err)
			}
			if !va.Status.Attached || va.DeletionTimestamp != nil {
				return fmt.Errorf("protect pod %s/%s: VolumeAttachment %s of PV %s not attached", pod.Namespace, pod.Name, name, pv.Name)
			}
			volumes = append(volumes, &protectedVolume{
				pod: pod.UID, podName: pod.Namespace + "/" + pod.Name, pv: pv.Name, node: pod.Spec.NodeName,
				attachment: name, uid: va.UID, unique: v1.UniqueVolumeName(framework.CSIVolumeName(d, h)),
			})
		}
		w.protect(&pod, volumes)
	}
	return nil
}

func (w *DetachWatch) protect(pod *v1.Pod, volumes []*protectedVolume) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pods[pod.UID] = &protectedPod{namespace: pod.Namespace, name: pod.Name, node: pod.Spec.NodeName, restarts: restarts(pod)}
	for _, v := range volumes {
		v.listed = slices.Contains(w.listed[v.node], v.unique)
		w.volumes[v.attachment] = v
	}
}

// Release stops guarding the pods and their volumes: call it before the
// pod is deleted or evicted.
func (w *DetachWatch) Release(pods ...v1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range pods {
		delete(w.pods, p.UID)
		for name, v := range w.volumes {
			if v.pod == p.UID {
				delete(w.volumes, name)
			}
		}
	}
}

// Protected is the number of pods and volumes guarded now.
func (w *DetachWatch) Protected() (pods, volumes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pods), len(w.volumes)
}

// Violations are the disturbances seen, in order.
func (w *DetachWatch) Violations() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.violations)
}

// Err is nil, or an error listing the violations.
func (w *DetachWatch) Err() error {
	v := w.Violations()
	if len(v) == 0 {
		return nil
	}
	return errors.New("a running pod or its volume disturbed:\n  " + strings.Join(v, "\n  "))
}

// Deletion is the deletion of the object of kind (KindVolumeAttachment,
// KindPersistentVolume) called name, as seen so far.
func (w *DetachWatch) Deletion(kind, name string) (Deletion, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d, ok := w.deletions[kind+"/"+name]
	if !ok {
		return Deletion{}, false
	}
	return *d, true
}

// violation records a violation once per key. Called with mu held.
func (w *DetachWatch) violation(key, format string, args ...any) {
	if w.reported[key] {
		return
	}
	w.reported[key] = true
	w.violations = append(w.violations, fmt.Sprintf("%6.2fs ", time.Since(w.started).Seconds())+fmt.Sprintf(format, args...))
}

// deleting records the deletion of an object. Called with mu held.
func (w *DetachWatch) deleting(kind string, obj metav1.Object, removed bool) {
	if obj.GetDeletionTimestamp() == nil && !removed {
		return
	}
	key := kind + "/" + obj.GetName()
	d := w.deletions[key]
	if d == nil || (d.Removed != 0 && !removed) {
		// A new object of the same name starts over.
		d = &Deletion{}
		w.deletions[key] = d
	}
	rv, _ := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	switch {
	case removed:
		d.Removed, d.RemovedAt = rv, time.Now()
	case d.Started == 0:
		d.Started = rv
	}
}

func (w *DetachWatch) vaSeen(obj any) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleting(KindVolumeAttachment, va, false)
	v, ok := w.volumes[va.Name]
	switch {
	case !ok:
	case va.UID != v.uid:
		w.violation("replaced "+va.Name, "VolumeAttachment %s of PV %s (pod %s) on %s replaced: UID %s, was %s", va.Name, v.pv, v.podName, v.node, va.UID, v.uid)
	case va.DeletionTimestamp != nil:
		w.violation("deleting "+va.Name, "VolumeAttachment %s of PV %s (pod %s) on %s being deleted (resourceVersion %s)", va.Name, v.pv, v.podName, v.node, va.ResourceVersion)
	case !va.Status.Attached:
		w.violation("unattached "+va.Name, "VolumeAttachment %s of PV %s (pod %s) on %s no longer attached (resourceVersion %s)", va.Name, v.pv, v.podName, v.node, va.ResourceVersion)
	}
}

func (w *DetachWatch) vaGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleting(KindVolumeAttachment, va, true)
	if v, ok := w.volumes[va.Name]; ok {
		w.violation("deleted "+va.Name, "VolumeAttachment %s of PV %s (pod %s) on %s deleted", va.Name, v.pv, v.podName, v.node)
	}
}

func (w *DetachWatch) pvSeen(obj any) {
	if pv, ok := obj.(*v1.PersistentVolume); ok {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.deleting(KindPersistentVolume, pv, false)
	}
}

func (w *DetachWatch) pvGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pv, ok := obj.(*v1.PersistentVolume); ok {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.deleting(KindPersistentVolume, pv, true)
	}
}

func (w *DetachWatch) nodeSeen(obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	listed := make([]v1.UniqueVolumeName, 0, len(node.Status.VolumesAttached))
	for _, a := range node.Status.VolumesAttached {
		listed = append(listed, a.Name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.listed[node.Name] = listed
	for _, v := range w.volumes {
		switch {
		case v.node != node.Name:
		case slices.Contains(listed, v.unique):
			v.listed = true
		case v.listed:
			w.violation("dropped "+v.attachment+" "+node.ResourceVersion,
				"node %s status.volumesAttached dropped %s of PV %s (pod %s) (resourceVersion %s)", node.Name, v.unique, v.pv, v.podName, node.ResourceVersion)
			// Judge the next drop, if it is listed again meanwhile.
			v.listed = false
		}
	}
}

func (w *DetachWatch) podSeen(obj any) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pods[pod.UID]
	if !ok {
		return
	}
	name := p.namespace + "/" + p.name
	switch {
	case pod.DeletionTimestamp != nil:
		w.violation("deleting "+name, "pod %s on %s being deleted", name, p.node)
	case pod.Status.Phase != v1.PodRunning:
		w.violation("phase "+name, "pod %s on %s %s", name, p.node, pod.Status.Phase)
	case !podReady(pod):
		w.violation("ready "+name, "pod %s on %s not Ready (resourceVersion %s)", name, p.node, pod.ResourceVersion)
	}
	if r := restarts(pod); r > p.restarts {
		w.violation("restarts "+name, "pod %s on %s: a container restarted (%d restarts, %d when protected)", name, p.node, r, p.restarts)
	}
}

func (w *DetachWatch) podGone(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if p, ok := w.pods[pod.UID]; ok {
		w.violation("gone "+p.namespace+"/"+p.name, "pod %s/%s on %s deleted", p.namespace, p.name, p.node)
	}
}

func restarts(pod *v1.Pod) int32 {
	var n int32
	for _, s := range pod.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}
