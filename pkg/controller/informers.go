package controller

import (
	"fmt"
	"maps"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// indexByNode indexes pods by their node. (Claims and PVs are indexed by a
// refIndex: see Controller.claimPods.)
const indexByNode = "byNode"

// Trim keeps in the informer caches only what the controller reads: of pods,
// nodes, PVs and claims, most is of no use here. Informers passed in Config.Informers must apply it.
func Trim(obj any) (any, error) {
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		m.GetObjectMeta().SetManagedFields(nil)
	}
	switch o := obj.(type) {
	case *v1.Pod:
		return trimPod(o), nil
	case *v1.Node:
		return trimNode(o), nil
	case *v1.PersistentVolume:
		return trimPV(o), nil
	case *v1.PersistentVolumeClaim:
		return trimPVC(o), nil
	case *storagev1.VolumeAttachment:
		return trimVA(o), nil
	}
	return obj, nil
}

// trimPV keeps the source, access modes and claim the controller resolves a
// volume from, and the labels and node affinity that csi-translation-lib
// reads when it translates an in-tree source (a CSI source needs neither);
// not its capacity, mount options, annotations or status message.
func trimPV(pv *v1.PersistentVolume) *v1.PersistentVolume {
	out := &v1.PersistentVolume{
		TypeMeta: pv.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pv.Name, UID: pv.UID, ResourceVersion: pv.ResourceVersion, Labels: pv.Labels,
			DeletionTimestamp: pv.DeletionTimestamp,
		},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: trimSource(pv.Spec.PersistentVolumeSource),
			AccessModes:            pv.Spec.AccessModes,
			VolumeMode:             pv.Spec.VolumeMode,
			NodeAffinity:           pv.Spec.NodeAffinity,
		},
		Status: v1.PersistentVolumeStatus{Phase: pv.Status.Phase},
	}
	if r := pv.Spec.ClaimRef; r != nil {
		out.Spec.ClaimRef = &v1.ObjectReference{Namespace: shared(r.Namespace), Name: r.Name, UID: r.UID}
	}
	if pv.Spec.CSI != nil {
		out.Labels = nil
		out.Spec.NodeAffinity = nil
	}
	return out
}

// trimVA keeps what names and places a VolumeAttachment (name, UID,
// deletion, spec) and what the attacher reports (attached, errors); not
// its annotations, finalizers or attachment metadata.
func trimVA(va *storagev1.VolumeAttachment) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		TypeMeta: va.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: va.Name, UID: va.UID, ResourceVersion: va.ResourceVersion, DeletionTimestamp: va.DeletionTimestamp,
		},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: shared(va.Spec.Attacher), NodeName: shared(va.Spec.NodeName), Source: va.Spec.Source,
		},
		Status: storagev1.VolumeAttachmentStatus{
			Attached: va.Status.Attached, AttachError: va.Status.AttachError, DetachError: va.Status.DetachError,
		},
	}
}

// trimSource keeps of a CSI source what names and attaches the volume
// (driver, handle, read-only), not its attributes or secret references; an
// in-tree source is kept whole (csi-translation-lib reads it).
func trimSource(src v1.PersistentVolumeSource) v1.PersistentVolumeSource {
	if csi := src.CSI; csi != nil {
		src.CSI = &v1.CSIPersistentVolumeSource{Driver: shared(csi.Driver), VolumeHandle: csi.VolumeHandle, ReadOnly: csi.ReadOnly}
	}
	return src
}

// shared returns one copy of each distinct string: the node, namespace and
// driver names that thousands of cached objects repeat are held once, not
// once per object as decoding leaves them. The table forgets everything
// when it grows past maxShared distinct strings (a bound, not a cache).
func shared(s string) string {
	if s == "" {
		return s
	}
	sharedStrings.Lock()
	defer sharedStrings.Unlock()
	if v, ok := sharedStrings.m[s]; ok {
		return v
	}
	if len(sharedStrings.m) >= maxShared {
		clear(sharedStrings.m)
	}
	sharedStrings.m[s] = s
	return s
}

const maxShared = 1 << 17

var sharedStrings = struct {
	sync.Mutex
	m map[string]string
}{m: map[string]string{}}

// trimPVC keeps what binds a claim to its PV, and its controller: a
// generic ephemeral volume's claim counts only when the pod controls it
// (claimedPV).
func trimPVC(pvc *v1.PersistentVolumeClaim) *v1.PersistentVolumeClaim {
	out := &v1.PersistentVolumeClaim{
		TypeMeta: pvc.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace: shared(pvc.Namespace), Name: pvc.Name, UID: pvc.UID, ResourceVersion: pvc.ResourceVersion,
			DeletionTimestamp: pvc.DeletionTimestamp,
		},
		Spec:   v1.PersistentVolumeClaimSpec{VolumeName: pvc.Spec.VolumeName},
		Status: v1.PersistentVolumeClaimStatus{Phase: pvc.Status.Phase},
	}
	if ref := metav1.GetControllerOfNoCopy(pvc); ref != nil {
		out.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID, Controller: ref.Controller,
		}}
	}
	return out
}

func trimPod(p *v1.Pod) *v1.Pod {
	out := &v1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: shared(p.Namespace), UID: p.UID,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
			// A restart reads the newest pods first (Recovery).
			CreationTimestamp: p.CreationTimestamp,
		},
		Spec:   v1.PodSpec{NodeName: shared(p.Spec.NodeName)},
		Status: v1.PodStatus{Phase: p.Status.Phase},
	}
	if p.DeletionTimestamp != nil {
		// Whether a deleted pod still runs a container decides whether it
		// has terminated (podTerminated); only then is it worth keeping.
		out.Status.InitContainerStatuses = trimStatuses(p.Status.InitContainerStatuses)
		out.Status.ContainerStatuses = trimStatuses(p.Status.ContainerStatuses)
		out.Status.EphemeralContainerStatuses = trimStatuses(p.Status.EphemeralContainerStatuses)
	}
	for _, vol := range p.Spec.Volumes {
		switch {
		case vol.ConfigMap != nil, vol.Secret != nil, vol.Projected != nil, vol.EmptyDir != nil,
			vol.DownwardAPI != nil, vol.HostPath != nil, vol.Image != nil, vol.CSI != nil:
			continue
		case vol.Ephemeral != nil:
			// Only the claim's name matters: <pod>-<volume>.
			vol = v1.Volume{Name: vol.Name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}
		}
		out.Spec.Volumes = append(out.Spec.Volumes, vol)
	}
	return out
}

// trimStatuses keeps of each container status whether it is running,
// waiting or terminated.
func trimStatuses(in []v1.ContainerStatus) []v1.ContainerStatus {
	if len(in) == 0 {
		return nil
	}
	out := make([]v1.ContainerStatus, len(in))
	for i, st := range in {
		out[i].Name = st.Name
		switch {
		case st.State.Terminated != nil:
			out[i].State.Terminated = &v1.ContainerStateTerminated{}
		case st.State.Waiting != nil:
			out[i].State.Waiting = &v1.ContainerStateWaiting{}
		case st.State.Running != nil:
			out[i].State.Running = &v1.ContainerStateRunning{}
		}
	}
	return out
}

func trimNode(n *v1.Node) *v1.Node {
	out := &v1.Node{
		TypeMeta: n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion,
		},
		Spec: v1.NodeSpec{Taints: n.Spec.Taints},
		Status: v1.NodeStatus{
			VolumesInUse:    n.Status.VolumesInUse,
			VolumesAttached: n.Status.VolumesAttached,
		},
	}
	if v, ok := n.Annotations[managedAnnotation]; ok {
		out.Annotations = map[string]string{managedAnnotation: v}
	}
	// Of its labels only the zone is read (zones.go).
	if z, ok := n.Labels[v1.LabelTopologyZone]; ok {
		out.Labels = map[string]string{v1.LabelTopologyZone: shared(z)}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			out.Status.Conditions = []v1.NodeCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return out
}

func podNodeIndex(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{p.Spec.NodeName}, nil
}

// podClaims returns the "namespace/name" of every claim a pod uses, generic
// ephemeral ones included.
func podClaims(obj any) []string {
	p, ok := unwrap(obj).(*v1.Pod)
	if !ok {
		return nil
	}
	var claims []string
	for _, vol := range p.Spec.Volumes {
		if name := volume.ClaimName(p, &vol); name != "" {
			claims = append(claims, p.Namespace+"/"+name)
		}
	}
	return claims
}

// unwrap returns the last known object of a delete whose final state is
// unknown, any other object as it is.
func unwrap(obj any) any {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

// refIndexed is a ref index with the informer whose handler keeps it and
// what an object of that informer refers to.
type refIndexed struct {
	informer toolscache.SharedIndexInformer
	index    *refIndex
	refs     func(obj any) []string
}

// refIndexes lists the controller's ref indexes (see Controller.claimPods).
func (c *Controller) refIndexes() []refIndexed {
	inf := c.informers
	return []refIndexed{
		{inf.Pods, c.claimPods, podClaims},
		{inf.PVs, c.claimPVs, pvClaim},
		{inf.VolumeAttachments, c.pvAttachments, attachmentPV},
	}
}

// indexed returns a handler that records in x what each object refers to
// (refs of the old and the new object) and then calls then: a lookup by
// whatever then queues finds the object.
func indexed(x *refIndex, refs func(obj any) []string, then toolscache.ResourceEventHandler) toolscache.ResourceEventHandler {
	record := func(obj any, was, is []string) {
		if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			x.update(k, was, is)
		}
	}
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) {
			record(obj, nil, refs(obj))
			then.OnAdd(obj, isInInitialList)
		},
		UpdateFunc: func(old, obj any) {
			record(obj, refs(old), refs(obj))
			then.OnUpdate(old, obj)
		},
		DeleteFunc: func(obj any) {
			record(obj, refs(obj), nil)
			then.OnDelete(obj)
		},
	}
}

// afterInitialList passes on every event but the adds of the informer's
// initial list. Run recovers once every handler has seen that list (the
// registrations' HasSynced): Recover syncs every object the listers then
// hold, so each of those adds is covered, and queueing it as well would
// give every object of the cluster a second look right after the restart,
// ahead of the changes made meanwhile (at 100,000 volumes, seconds of
// syncs before a new VolumeAttachment's update is read). Updates and
// deletes, and the adds of a later relist, are passed on.
func afterInitialList(h toolscache.ResourceEventHandler) toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, isInInitialList bool) {
			if !isInInitialList {
				h.OnAdd(obj, false)
			}
		},
		UpdateFunc: h.OnUpdate,
		DeleteFunc: h.OnDelete,
	}
}

func (c *Controller) addHandlers() error {
	inf := c.informers
	key := func(obj any) (string, bool) {
		k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		return k, err == nil
	}
	enqueue := func(q interface{ Add(string) }) toolscache.ResourceEventHandlerFuncs {
		return objectHandler(func(obj any) {
			if k, ok := key(obj); ok {
				q.Add(k)
			}
		})
	}
	handlers := []struct {
		informer toolscache.SharedIndexInformer
		handler  toolscache.ResourceEventHandler
	}{
		{inf.Pods, toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				if k, ok := key(obj); ok {
					c.podQueue.Add(k)
				}
			},
			UpdateFunc: func(oldObj, obj any) {
				// Status churn (container states, conditions) is trimmed
				// away: only a change the controller reads queues the pod.
				if o, ok := oldObj.(*v1.Pod); ok {
					if p, ok := obj.(*v1.Pod); ok && samePodFacts(o, p) {
						return
					}
				}
				if k, ok := key(obj); ok {
					c.podQueue.Add(k)
				}
			},
			DeleteFunc: func(obj any) {
				if k, ok := key(obj); ok {
					c.podQueue.Add(k)
				}
			},
		}},
		{inf.Nodes, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    c.nodeAdded,
			UpdateFunc: c.nodeChanged,
			DeleteFunc: c.nodeDeleted,
		}},
		{inf.VolumeAttachments, enqueue(c.attachmentQueue)},
		{inf.PVCs, objectHandler(func(obj any) {
			if k, ok := key(obj); ok {
				c.enqueueClaimPods(k)
			}
		})},
		{inf.PVs, objectHandler(c.pvChanged)},
		{inf.CSIDrivers, objectHandler(func(any) { c.enqueueAllPods() })},
		{inf.CSINodes, objectHandler(func(obj any) {
			if k, ok := key(obj); ok {
				c.enqueueNodePods(k)
			}
		})},
	}
	for _, h := range handlers {
		// The ref indexes see every add, the initial list's too.
		handler := afterInitialList(h.handler)
		for _, r := range c.refIndexes() {
			if r.informer == h.informer {
				handler = indexed(r.index, r.refs, handler)
			}
		}
		reg, err := h.informer.AddEventHandler(handler)
		if err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		c.addSynced(h.informer, reg.HasSynced)
	}
	if o := c.cfg.Observer; o != nil {
		forget := toolscache.ResourceEventHandlerFuncs{DeleteFunc: o.Forget}
		for _, i := range []toolscache.SharedIndexInformer{inf.Nodes, inf.VolumeAttachments} {
			if _, err := i.AddEventHandler(forget); err != nil {
				return fmt.Errorf("add event handler: %w", err)
			}
		}
	}
	return nil
}

// objectHandler calls fn with the new object of every add, update and delete.
func objectHandler(fn func(obj any)) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    fn,
		UpdateFunc: func(_, obj any) { fn(obj) },
		DeleteFunc: fn,
	}
}

// nodeChanged queues the node, unless the update only echoes a status the
// controller wrote or carries nothing the controller reads (heartbeats). An
// update that looks the same to the informer but lists other volumes than
// the controller reported, or says other than the node's facts, is queued:
// a relist may bring back what the informer had cached while the
// controller's own writes, and their answers, changed it since.
func (c *Controller) nodeChanged(oldObj, obj any) {
	if o, ok := oldObj.(*v1.Node); ok {
		n, ok := obj.(*v1.Node)
		if ok && sameNodeFacts(o, n) && c.status.Lists(n.Name, n.Status.VolumesAttached) && c.knownFacts(n) {
			return
		}
		if ok && managed(o) != managed(n) {
			// Its pods need attaching (or no longer) only now.
			c.enqueueNodePods(n.Name)
		}
	}
	if k, err := toolscache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		c.nodeQueue.Add(k)
	}
}

// knownFacts reports whether n says what the node's facts hold: the answer
// of a status write may have set them since the informer's copy, which a
// relist brings back as an update that looks the same to it.
func (c *Controller) knownFacts(n *v1.Node) bool {
	known, ok := c.actual.Node(n.Name)
	if !ok || !known.Exists {
		return false
	}
	says := NodeInfo(n)
	return says.UID == known.UID && says.Managed == known.Managed && says.Ready == known.Ready &&
		says.OutOfService == known.OutOfService && says.Zone == known.Zone && maps.Equal(says.InUse, known.InUse)
}

// nodeAdded queues the node and its pods: a pod synced while its node was
// not in the lister needs nothing, and this add is the one change that
// makes it need something again. (The node sync can't tell: a status write
// may have recorded the node as existing before its add was read.)
func (c *Controller) nodeAdded(obj any) {
	c.nodeChanged(nil, obj)
	if n, ok := obj.(*v1.Node); ok {
		c.enqueueNodePods(n.Name)
	}
}

// nodeDeleted queues the node with its last state: the updates before the
// delete may not have been synced, and what the node had mounted last
// decides whether its volumes may be detached before the max wait. A
// tombstone (a relist found the node gone) holds only the informer's last
// copy, which may miss mounts made since: no last state is recorded, and
// the node's sync takes what it had mounted as unknown.
func (c *Controller) nodeDeleted(obj any) {
	_, tombstone := obj.(toolscache.DeletedFinalStateUnknown)
	obj = unwrap(obj)
	if n, ok := obj.(*v1.Node); ok {
		c.mu.Lock()
		if tombstone {
			delete(c.goneNodes, n.Name)
		} else {
			c.goneNodes[n.Name] = n
		}
		c.mu.Unlock()
	}
	c.nodeChanged(nil, obj)
}

// sameNodeFacts compares trimmed nodes: what is left is what matters.
func sameNodeFacts(a, b *v1.Node) bool {
	a2, b2 := a.DeepCopy(), b.DeepCopy()
	a2.ResourceVersion, b2.ResourceVersion = "", ""
	return apiequality.Semantic.DeepEqual(a2, b2)
}

// samePodFacts compares trimmed pods: what is left is what matters.
func samePodFacts(a, b *v1.Pod) bool {
	return a.UID == b.UID && a.Spec.NodeName == b.Spec.NodeName && a.Status.Phase == b.Status.Phase &&
		(a.DeletionTimestamp == nil) == (b.DeletionTimestamp == nil) && podTerminated(a) == podTerminated(b) &&
		apiequality.Semantic.DeepEqual(a.Spec.Volumes, b.Spec.Volumes)
}

func (c *Controller) pvChanged(obj any) {
	pv, ok := unwrap(obj).(*v1.PersistentVolume)
	if !ok {
		return
	}
	// A VolumeAttachment of this PV can be identified again, whether or
	// not the PV is bound yet (one created again is bound to no claim).
	for _, va := range c.pvAttachments.get(pv.Name) {
		c.attachmentQueue.Add(va)
	}
	if pv.Spec.ClaimRef != nil {
		c.enqueueClaimPods(pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name)
	}
}

// pvClaim returns the "namespace/name" of the claim a PV is bound to.
func pvClaim(obj any) []string {
	pv, ok := unwrap(obj).(*v1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil {
		return nil
	}
	return []string{pv.Spec.ClaimRef.Namespace + "/" + pv.Spec.ClaimRef.Name}
}

// attachmentPV returns the PV a VolumeAttachment attaches.
func attachmentPV(obj any) []string {
	va, ok := unwrap(obj).(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Source.PersistentVolumeName == nil {
		return nil
	}
	return []string{*va.Spec.Source.PersistentVolumeName}
}

func (c *Controller) nodeInfoHandler() toolscache.ResourceEventHandler {
	return objectHandler(func(obj any) {
		if u, ok := unwrap(obj).(*unstructured.Unstructured); ok {
			c.enqueueNodePods(u.GetName())
		}
	})
}

// enqueueClaimPods queues the pods that use a claim ("namespace/name").
func (c *Controller) enqueueClaimPods(claim string) {
	for _, k := range c.claimPods.get(claim) {
		c.podQueue.Add(k)
	}
}

// enqueueNodePods queues the pods on a node.
func (c *Controller) enqueueNodePods(node string) {
	for _, p := range c.podsOn(node) {
		c.podQueue.Add(p.Namespace + "/" + p.Name)
	}
}

func (c *Controller) enqueueAllPods() {
	for _, k := range c.podIndex.ListKeys() {
		c.podQueue.Add(k)
	}
}
