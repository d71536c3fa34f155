package sim

import (
	"fmt"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
	"github.com/kube-attach/attach-detach-controller/test/invariants"
)

type (
	workqueueOf[T comparable] = workqueue.TypedRateLimitingInterface[T]
	runtimeObject             = runtime.Object
	volumeSpec                = volume.Spec
	volumeName                = volume.Name
)

const (
	ns              = "ns"
	csiDriver       = "csi.example.com"
	ebsDriver       = "ebs.csi.aws.com"
	managed         = "volumes.kubernetes.io/controller-managed-attach-detach"
	migratedPlugins = "storage.alpha.kubernetes.io/migrated-plugins"
	outOfService    = invariants.OutOfService
	iscsiIQN        = "iqn.2001-04.com.example:storage"
)

// simVolume is one PV of the universe and what the checker knows of it,
// computed here and not by the controller's code.
type simVolume struct {
	pv    string
	names []string // its unique names (a migratable volume has two)
	// singleNode as upstream's IsMultiAttachAllowed says.
	singleNode bool
	source     v1.PersistentVolumeSource
	modes      []v1.PersistentVolumeAccessMode
}

// inv is the volume as the shared invariants see it.
func (v *simVolume) inv() invariants.Volume {
	return invariants.Volume{PV: v.pv, SingleNode: v.singleNode, Names: v.names}
}

func (s *Sim) volumeByPV(pv string) *simVolume {
	for i := range s.vols {
		if s.vols[i].pv == pv {
			return &s.vols[i]
		}
	}
	return nil
}

func (s *Sim) volumeByName(name string) *simVolume {
	for i := range s.vols {
		if slices.Contains(s.vols[i].names, name) {
			return &s.vols[i]
		}
	}
	return &simVolume{pv: "unknown:" + name, names: []string{name}}
}

func nodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// setup creates the universe: managed Ready nodes with their CSINodes, the
// CSI driver, and bound PV/PVC pairs of every kind the controller handles.
func (s *Sim) setup() {
	rwo, rwop, rwx, rox := v1.ReadWriteOnce, v1.ReadWriteOncePod, v1.ReadWriteMany, v1.ReadOnlyMany
	csi := func(h string) v1.PersistentVolumeSource {
		return v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: csiDriver, VolumeHandle: h}}
	}
	csiName := func(driver, h string) string { return "kubernetes.io/csi/" + driver + "^" + h }
	s.vols = []simVolume{
		{pv: "rwo-0", names: []string{csiName(csiDriver, "h-rwo-0")}, singleNode: true, source: csi("h-rwo-0"), modes: []v1.PersistentVolumeAccessMode{rwo}},
		{pv: "rwo-1", names: []string{csiName(csiDriver, "h-rwo-1")}, singleNode: true, source: csi("h-rwo-1"), modes: []v1.PersistentVolumeAccessMode{rwo}},
		{pv: "rwop", names: []string{csiName(csiDriver, "h-rwop")}, singleNode: true, source: csi("h-rwop"), modes: []v1.PersistentVolumeAccessMode{rwop}},
		{pv: "rwx", names: []string{csiName(csiDriver, "h-rwx")}, source: csi("h-rwx"), modes: []v1.PersistentVolumeAccessMode{rwx}},
		{pv: "rwo-rox", names: []string{csiName(csiDriver, "h-rwo-rox")}, source: csi("h-rwo-rox"), modes: []v1.PersistentVolumeAccessMode{rwo, rox}},
		{pv: "iscsi", names: []string{"kubernetes.io/iscsi/10.0.0.1:3260:" + iscsiIQN + ":0"}, singleNode: true,
			source: v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: iscsiIQN}},
			modes:  []v1.PersistentVolumeAccessMode{rwo}},
		{pv: "ebs", names: []string{"kubernetes.io/aws-ebs/vol-ebs", csiName(ebsDriver, "vol-ebs")}, singleNode: true,
			source: v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-ebs"}},
			modes:  []v1.PersistentVolumeAccessMode{rwo}},
	}
	for i := range s.cfg.Nodes {
		s.createNode(nodeName(i))
		s.createCSINode(nodeName(i))
	}
	s.w.create(rCSIDrivers, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: csiDriver}})
	for _, v := range s.vols {
		s.createPV(v)
		s.createClaim(v.pv)
	}
	s.w.pending = map[string][]event{}
}

// createPV creates v's PV (a new UID), bound to its claim if that exists.
func (s *Sim) createPV(v simVolume) {
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: v.pv},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v.source, AccessModes: v.modes}}
	if pvc := s.w.get(rPVCs, ns+"/c-"+v.pv); pvc != nil {
		pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: ns, Name: pvc.GetName(), UID: pvc.GetUID()}
		pv.Status.Phase = v1.VolumeBound
	}
	s.w.create(rPVs, pv)
}

func (s *Sim) createNode(name string) {
	s.w.create(rNodes, &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{managed: "true"},
			Labels: map[string]string{v1.LabelTopologyZone: s.zoneOf(name)}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
	})
	delete(s.deletedNodes, name)
	delete(s.zone.deletedAt, name)
	delete(s.zone.deletedGen, name)
	delete(s.deletedInUse, name)
	delete(s.thirdPartyListed, name)
	delete(s.thirdPartyRemoved, name)
	delete(s.flapped, name)
	delete(s.selfAttach, name)
	delete(s.kubeletVA, name)
	delete(s.selfMounted, name)
	delete(s.mounts, name)
	delete(s.statusWritten, name)
}

func (s *Sim) createCSINode(name string) {
	s.w.create(rCSINodes, &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{migratedPlugins: "kubernetes.io/aws-ebs"}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
			{Name: csiDriver, NodeID: name}, {Name: ebsDriver, NodeID: name}}},
	})
}

// createClaim creates the claim of pv, bound to it (a new claim UID: the PV
// is bound to the new claim).
func (s *Sim) createClaim(pvName string) {
	pvc := s.w.create(rPVCs, &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c-" + pvName},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pvName},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	})
	o := s.w.get(rPVs, pvName)
	if o == nil {
		// Bound when its PV is created again.
		return
	}
	pv := o.(*v1.PersistentVolume).DeepCopy()
	pv.Spec.ClaimRef = &v1.ObjectReference{Namespace: ns, Name: pvc.GetName(), UID: pvc.GetUID()}
	pv.Status.Phase = v1.VolumeBound
	s.w.update(rPVs, pv)
}

// boundNow reports whether the pod's claim and PV exist and are bound to
// each other now: what a kubelet's volume manager reads before it attaches
// or mounts a volume (a claim gone, or created again and not bound yet,
// names no volume it can mount).
func (s *Sim) boundNow(p *v1.Pod) bool {
	c, o := s.w.get(rPVCs, ns+"/c-"+podPV(p)), s.w.get(rPVs, podPV(p))
	if c == nil || o == nil {
		return false
	}
	ref := o.(*v1.PersistentVolume).Spec.ClaimRef
	return ref != nil && ref.UID == c.GetUID()
}

// live reports whether a pod has not terminated (upstream IsPodTerminated,
// negated), as the checker understands it.
func live(p *v1.Pod) bool {
	if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
		return false
	}
	if p.DeletionTimestamp == nil {
		return true
	}
	for _, st := range p.Status.ContainerStatuses {
		if st.State.Terminated == nil && st.State.Waiting == nil {
			return true
		}
	}
	return false
}

func podPV(p *v1.Pod) string { return p.Annotations["sim/pv"] }

// resolved: the pod's claim and its PV existed at some moment while the
// pod lived, so its kubelet knows the volume (a pod whose claim or PV never
// existed mounts nothing).
func (s *Sim) resolved(p *v1.Pod) bool {
	_, ok := s.resolvedAt(p)
	return ok
}

// resolvedAt is when the pod's claim and PV were first seen to exist while
// the pod lived.
func (s *Sim) resolvedAt(p *v1.Pod) (time.Time, bool) {
	k := string(p.UID)
	if _, ok := s.podResolved[k]; !ok && s.w.get(rPVCs, ns+"/c-"+podPV(p)) != nil && s.w.get(rPVs, podPV(p)) != nil {
		s.podResolved[k] = s.clock.Now()
	}
	t, ok := s.podResolved[k]
	return t, ok
}

// wanted: the volume is used by a live pod on an existing managed node.
func (s *Sim) wanted() map[pair]bool { return s.wantedFor(0) }

// wantedFor: the volume is used by a live pod on an existing node whose
// claim was resolved at least d ago; for d > 0, whose want the running
// controller generation has had d to see: its claim and PV there to read,
// its node there, for d at a stretch since it started. (A
// controller that never saw them cannot know which volume the pod uses, nor
// can kubelet, to mount it.)
func (s *Sim) wantedFor(d time.Duration) map[pair]bool {
	out := map[pair]bool{}
	now := s.clock.Now()
	for _, o := range s.w.list(rPods) {
		p := o.(*v1.Pod)
		t, ok := s.resolvedAt(p)
		ok = ok && now.Sub(t) >= d
		if d > 0 {
			since, streak := s.wantStreak[string(p.UID)]
			ok = s.wantSeen[string(p.UID)] || (streak && now.Sub(since) >= d)
		}
		if ok && live(p) && s.w.node(p.Spec.NodeName) != nil {
			out[pair{podPV(p), p.Spec.NodeName}] = true
		}
	}
	return out
}

// wantedKnown is wanted, of the pods whose want the running controller
// generation could read at some moment (wantRead): a pod whose claim or PV
// went before it started, and never came back while its node was managed,
// uses a volume the controller cannot name (upstream's, which adds a pod's
// volumes from its claim, cannot either).
func (s *Sim) wantedKnown() map[pair]bool {
	out := map[pair]bool{}
	for _, o := range s.w.list(rPods) {
		p := o.(*v1.Pod)
		if s.wantRead[string(p.UID)] == s.gen && s.resolved(p) && live(p) && s.w.node(p.Spec.NodeName) != nil {
			out[pair{podPV(p), p.Spec.NodeName}] = true
		}
	}
	return out
}

// noteWants keeps, for each pod, since when its want could be read at a
// stretch (wantStreak), whether that lasted seenWant while the running
// controller generation lived (wantSeen), and the last generation that
// could read it at all (wantRead).
func (s *Sim) noteWants() {
	now := s.clock.Now()
	if s.wantRead == nil {
		s.wantRead = map[string]int{}
	}
	for _, o := range s.w.list(rPods) {
		p := o.(*v1.Pod)
		uid := string(p.UID)
		n := s.w.node(p.Spec.NodeName)
		if !live(p) || n == nil || s.w.get(rPVCs, ns+"/c-"+podPV(p)) == nil || s.w.get(rPVs, podPV(p)) == nil {
			delete(s.wantStreak, uid)
			continue
		}
		s.wantRead[uid] = s.gen
		since, ok := s.wantStreak[uid]
		if !ok {
			s.wantStreak[uid] = now
		} else if now.Sub(since) >= seenWant {
			s.wantSeen[uid] = true
		}
	}
}

// kubeletAttaches returns the attaches and detaches a node's kubelet that
// attaches by itself (enableControllerAttachDetach=false: the node has no
// managed annotation) would make now. As kubelet's CSI attacher
// does, it creates the VolumeAttachment of a volume a live pod on the node
// uses, under the name the controller would give it, and deletes one it
// created once no live pod uses it and it is not mounted. Only volumes that
// may attach to many nodes: for a single-node one, it would race the
// controller attaching the volume elsewhere, as it does in a cluster.
func (s *Sim) kubeletAttaches(n *v1.Node) []func() {
	if !s.attachesByItself(n.Name) || !ready(n) {
		return nil
	}
	uses := map[string]bool{}
	for _, o := range s.w.list(rPods) {
		if p := o.(*v1.Pod); p.Spec.NodeName == n.Name && live(p) && s.resolved(p) && s.boundNow(p) {
			uses[podPV(p)] = true
		}
	}
	var todo []func()
	for _, v := range s.vols {
		if v.singleNode || v.source.CSI == nil || !uses[v.pv] || s.w.get(rPVs, v.pv) == nil {
			continue
		}
		name := volume.AttachmentName(v.source.CSI.VolumeHandle, v.source.CSI.Driver, n.Name)
		if s.w.get(rAttachments, name) != nil {
			continue
		}
		pv := v.pv
		todo = append(todo, func() {
			s.stats["fault: kubelet attached a volume by itself"]++
			s.tracef("kubelet %s: create VolumeAttachment %s (%s), attaching by itself", n.Name, name, pv)
			s.thirdPartyVA[name] = true
			if s.kubeletVA[n.Name] == nil {
				s.kubeletVA[n.Name] = map[string]bool{}
			}
			s.kubeletVA[n.Name][name] = true
			s.w.create(rAttachments, &storagev1.VolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: storagev1.VolumeAttachmentSpec{Attacher: v.source.CSI.Driver, NodeName: n.Name,
					Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
			})
		})
	}
	for _, va := range s.w.attachments() {
		if va.Spec.NodeName != n.Name || va.DeletionTimestamp != nil {
			continue
		}
		v := s.volumeByPV(attachmentVolume(va))
		if v == nil {
			continue
		}
		if name := v.names[0]; va.Status.Attached && uses[v.pv] && !s.selfMounted[n.Name][name] {
			// Mounted as soon as attached, and reported in use later
			// (kubeletChange): nothing waits for node status here.
			todo = append(todo, func() {
				s.tracef("kubelet %s: mounted %s, attached by itself", n.Name, name)
				if s.selfMounted[n.Name] == nil {
					s.selfMounted[n.Name] = map[string]bool{}
				}
				s.selfMounted[n.Name][name] = true
			})
		}
		if !s.kubeletVA[n.Name][va.Name] || uses[v.pv] || s.selfMounted[n.Name][v.names[0]] ||
			slices.ContainsFunc(n.Status.VolumesInUse, func(x v1.UniqueVolumeName) bool { return slices.Contains(v.names, string(x)) }) {
			continue
		}
		todo = append(todo, func() {
			s.stats["fault: kubelet detached a volume by itself"]++
			s.tracef("kubelet %s: delete VolumeAttachment %s, detaching by itself", n.Name, va.Name)
			s.thirdPartyVA[va.Name] = true
			delete(s.kubeletVA[n.Name], va.Name)
			s.w.deleteObject(rAttachments, va.Name)
		})
	}
	return todo
}

// kubeletUnmounts returns the unmounts of the volumes a node's kubelet
// mounted while it attached by itself and no live pod there uses any more,
// whatever it does now.
func (s *Sim) kubeletUnmounts(n *v1.Node) []func() {
	if !ready(n) {
		return nil
	}
	var todo []func()
	for _, name := range slices.Sorted(maps.Keys(s.selfMounted[n.Name])) {
		if s.podUses(n.Name, s.volumeByName(name).pv) {
			continue
		}
		todo = append(todo, func() {
			s.tracef("kubelet %s: unmounted %s", n.Name, name)
			delete(s.selfMounted[n.Name], name)
		})
	}
	return todo
}

// podUses: a live pod on node uses the volume of pv.
func (s *Sim) podUses(node, pv string) bool {
	for _, o := range s.w.list(rPods) {
		if p := o.(*v1.Pod); p.Spec.NodeName == node && live(p) && s.resolved(p) && podPV(p) == pv {
			return true
		}
	}
	return false
}

// attachesByItself: the node's kubelet attaches by itself now. It was
// restarted so: it starts a while (seenWant) after its node lost the
// managed annotation, by when the controller has seen that. (Sooner, it
// would mount volumes the controller, yet to see the change, may detach
// as it does any volume no pod wants that node status does not list: no
// controller can prevent that.)
func (s *Sim) attachesByItself(node string) bool {
	since, ok := s.selfAttach[node]
	return ok && s.clock.Now().Sub(since) >= seenWant
}

// toldToAttach: the node's kubelet is told to attach by itself, started so
// or not yet.
func (s *Sim) toldToAttach(node string) bool {
	_, ok := s.selfAttach[node]
	return ok
}

func ready(n *v1.Node) bool { return invariants.Ready(n) }

func outOfServiceTaint(n *v1.Node) bool { return invariants.OutOfServiceTaint(n) }

// attacherPending: a VolumeAttachment waits for the external-attacher.
func (s *Sim) attacherPending() bool { return !s.w.attacherHeld && len(s.attacherTodo()) > 0 }

// attacherTodo returns the VolumeAttachments the external-attacher acts on
// now: being deleted, or not attached yet, unless its attach keeps failing
// for a while (the driver's volume still held elsewhere, say).
func (s *Sim) attacherTodo() []*storagev1.VolumeAttachment {
	var todo []*storagev1.VolumeAttachment
	for _, va := range s.w.attachments() {
		failing := s.faults && va.Status.AttachError != nil && s.clock.Now().Before(s.failingUntil[va.UID])
		if va.DeletionTimestamp != nil || (!va.Status.Attached && !failing) {
			todo = append(todo, va)
		}
	}
	return todo
}

// attacher acts on one VolumeAttachment as the CSI external-attacher does:
// finalizer, then attached (or an attach error); on delete, detach and
// remove the finalizer (or a detach error).
func (s *Sim) attacher() {
	todo := s.attacherTodo()
	va := todo[s.rng.Intn(len(todo))].DeepCopy()
	if va.DeletionTimestamp != nil {
		if s.faults && s.chance(0.15) {
			s.stats["fault: detach error"]++
			va.Status.DetachError = &storagev1.VolumeError{Message: "injected detach error"}
			s.tracef("attacher: detach error %s", va.Name)
			s.w.update(rAttachments, va)
			return
		}
		s.tracef("attacher: detached %s", va.Name)
		s.w.remove(rAttachments, va.Name)
		return
	}
	va.Finalizers = []string{"external-attacher/" + va.Spec.Attacher}
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil && s.w.get(rPVs, *pv) == nil {
		// The attacher reads the volume's handle from its PV.
		va.Status.AttachError = &storagev1.VolumeError{Message: "persistentvolume " + *pv + " not found"}
		s.tracef("attacher: attach error %s, its PV is missing", va.Name)
		if !s.w.update(rAttachments, va) {
			s.tracef("attacher: %s unchanged", va.Name)
		}
		return
	}
	if s.faults && s.chance(0.15) {
		s.stats["fault: attach error"]++
		va.Status.AttachError = &storagev1.VolumeError{Message: "injected attach error"}
		if s.chance(0.5) {
			// It keeps failing for up to a minute.
			s.stats["fault: attach error that lasts"]++
			s.failingUntil[va.UID] = s.clock.Now().Add(time.Duration(s.rng.Int63n(int64(time.Minute))))
		}
		s.tracef("attacher: attach error %s", va.Name)
	} else {
		va.Status.Attached, va.Status.AttachError = true, nil
		s.tracef("attacher: attached %s", va.Name)
	}
	s.w.update(rAttachments, va)
}

// workload makes one change a user, a kubelet or a cloud makes.
func (s *Sim) workload() {
	pods := s.w.list(rPods)
	var deleting, running []*v1.Pod
	for _, o := range pods {
		p := o.(*v1.Pod)
		switch {
		case p.DeletionTimestamp != nil:
			deleting = append(deleting, p)
		case live(p):
			running = append(running, p)
		}
	}
	nodes := s.w.list(rNodes)
	pick := func(n int) int { return s.rng.Intn(n) }
	switch x := s.rng.Float64() * 22; {
	case x < 5 && len(nodes) > 0:
		// The scheduler places pods on Ready nodes without the
		// out-of-service taint (they may change right after).
		v := s.vols[pick(len(s.vols))]
		if n := nodes[pick(len(nodes))].(*v1.Node); ready(n) && !outOfServiceTaint(n) {
			s.createPod(v.pv, n.Name)
		}
	case x < 8 && len(running) > 0:
		p := running[pick(len(running))].DeepCopy()
		now := metav1.NewTime(s.clock.Now())
		p.DeletionTimestamp = &now
		s.tracef("workload: delete pod %s (containers still running)", p.Name)
		s.w.update(rPods, p)
	case x < 9 && len(pods) > 0:
		p := pods[pick(len(pods))]
		s.tracef("workload: pod %s removed at once", p.GetName())
		s.w.remove(rPods, keyOf(p))
	case x < 11 && len(deleting) > 0:
		// Its kubelet stops the containers, and most often sets the
		// phase Succeeded as well; it removes the pod once its volumes
		// are unmounted (kubeletMounts).
		p := deleting[pick(len(deleting))].DeepCopy()
		if live(p) {
			p.Status.ContainerStatuses[0].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}
			what := "containers stopped"
			if s.chance(0.75) {
				p.Status.Phase = v1.PodSucceeded
				what += ", phase Succeeded"
			}
			s.tracef("workload: pod %s %s", p.Name, what)
			s.w.update(rPods, p)
		}
	case x < 11.5 && len(running) > 0:
		p := running[pick(len(running))].DeepCopy()
		p.Status.Phase = v1.PodSucceeded
		s.tracef("workload: pod %s succeeded", p.Name)
		s.w.update(rPods, p)
	case x >= 12 && x < 13 && len(nodes) > 0:
		// The node's kubelet is told to attach and detach by itself, or
		// to leave it to the controller again.
		n := nodes[pick(len(nodes))].(*v1.Node).DeepCopy()
		if _, ok := n.Annotations[managed]; ok {
			delete(n.Annotations, managed)
		} else {
			n.Annotations = map[string]string{managed: "true"}
		}
		delete(s.flapped, n.Name)
		if _, ok := s.selfAttach[n.Name]; ok && len(s.selfMounted[n.Name]) > 0 {
			s.stats["fault: node managed again, with volumes its kubelet mounted by itself"]++
			for name := range s.selfMounted[n.Name] {
				if !slices.Contains(n.Status.VolumesInUse, v1.UniqueVolumeName(name)) {
					s.stats["fault: node managed again, with volumes its kubelet mounted by itself not reported in use"]++
					break
				}
			}
		}
		delete(s.selfAttach, n.Name)
		if n.Annotations[managed] == "" {
			s.selfAttach[n.Name] = s.clock.Now()
		}
		s.stats["fault: node managed toggled"]++
		s.tracef("workload: node %s managed=%v", n.Name, n.Annotations[managed] != "")
		s.w.update(rNodes, n)
	case x < 13 && len(nodes) > 0:
		n := nodes[pick(len(nodes))].(*v1.Node).DeepCopy()
		if s.zone.partitioned[n.Name] {
			// Cut off: its kubelet can't say it is Ready.
			break
		}
		st := v1.ConditionTrue
		if ready(n) {
			st = v1.ConditionFalse
		}
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: st}}
		s.stats["fault: node readiness"]++
		s.tracef("workload: node %s Ready=%s", n.Name, st)
		s.w.update(rNodes, n)
	case x < 14 && len(nodes) > 0:
		n := nodes[pick(len(nodes))].(*v1.Node).DeepCopy()
		if outOfServiceTaint(n) {
			n.Spec.Taints = nil
		} else {
			n.Spec.Taints = []v1.Taint{{Key: outOfService, Effect: v1.TaintEffectNoExecute}}
		}
		s.stats["fault: out-of-service"]++
		s.tracef("workload: node %s out-of-service=%v", n.Name, outOfServiceTaint(n))
		s.w.update(rNodes, n)
	case x < 14.6 && len(nodes) > 1:
		n := nodes[pick(len(nodes))].(*v1.Node)
		s.stats["fault: node deleted"]++
		s.tracef("workload: node %s deleted", n.Name)
		s.deleteNode(n)
	case x < 15.5:
		for i := range s.cfg.Nodes {
			if name := nodeName(i); s.w.node(name) == nil {
				s.tracef("workload: node %s created again", name)
				s.createNode(name)
				break
			}
		}
	case x < 16.5:
		name := nodeName(pick(s.cfg.Nodes))
		if s.w.get(rCSINodes, name) != nil {
			s.stats["fault: CSINode deleted"]++
			s.tracef("workload: CSINode %s deleted", name)
			s.w.remove(rCSINodes, name)
		} else {
			s.tracef("workload: CSINode %s created", name)
			s.createCSINode(name)
		}
	case x < 20:
		v := s.vols[pick(len(s.vols))]
		if s.w.get(rPVCs, ns+"/c-"+v.pv) != nil {
			s.stats["fault: claim deleted"]++
			s.tracef("workload: claim c-%s deleted", v.pv)
			s.w.remove(rPVCs, ns+"/c-"+v.pv)
		} else {
			s.tracef("workload: claim c-%s created again", v.pv)
			s.createClaim(v.pv)
		}
	case x < 20.8 && len(pods) > 0 && len(nodes) > 0:
		// A StatefulSet's pod: deleted at once and created again under
		// its name with a new UID, with the same claim, wherever the
		// scheduler puts it.
		p := pods[pick(len(pods))].(*v1.Pod)
		n := nodes[pick(len(nodes))].(*v1.Node)
		if !ready(n) || outOfServiceTaint(n) {
			break
		}
		s.stats["fault: pod created again under its name (new UID)"]++
		if n.Name != p.Spec.NodeName {
			s.stats["fault: pod created again under its name (new UID), on another node"]++
		}
		s.tracef("workload: pod %s removed at once and created again", p.Name)
		s.w.remove(rPods, keyOf(p))
		s.createPodNamed(p.Name, podPV(p), n.Name)
	case x < 21.2 && len(nodes) > 1:
		n := nodes[pick(len(nodes))].(*v1.Node)
		s.stats["fault: node created again under its name (new UID)"]++
		s.tracef("workload: node %s deleted and created again", n.Name)
		s.deleteNode(n)
		s.createNode(n.Name)
	case x < 21.6:
		v := s.vols[pick(len(s.vols))]
		switch {
		case s.w.get(rPVs, v.pv) == nil:
			s.tracef("workload: PV %s created again", v.pv)
			s.createPV(v)
		case slices.ContainsFunc(s.w.attachments(), func(va *storagev1.VolumeAttachment) bool { return attachmentVolume(va) == v.pv }):
			// The external-attacher's finalizer holds a PV while a
			// VolumeAttachment of it exists (an admin removing the
			// other finalizers gets no further).
		case s.chance(0.5):
			s.stats["fault: PV deleted"]++
			s.tracef("workload: PV %s deleted (its finalizers removed)", v.pv)
			s.w.remove(rPVs, v.pv)
		default:
			s.stats["fault: PV created again under its name (new UID)"]++
			s.tracef("workload: PV %s deleted and created again", v.pv)
			s.w.remove(rPVs, v.pv)
			s.createPV(v)
		}
	default:
		v := s.vols[pick(len(s.vols))]
		if s.w.get(rPVCs, ns+"/c-"+v.pv) == nil {
			break
		}
		s.stats["fault: claim created again under its name (new UID)"]++
		s.tracef("workload: claim c-%s deleted and created again", v.pv)
		s.w.remove(rPVCs, ns+"/c-"+v.pv)
		s.createClaim(v.pv)
	}
}

// deleteNode removes a Node object, and its pods as the pod garbage
// collector does.
func (s *Sim) deleteNode(n *v1.Node) {
	s.deletedNodes[n.Name] = true
	s.deletedSeen[n.Name] = s.clock.Now()
	s.zone.deletedGen[n.Name] = s.gen
	if n.Annotations[managed] != "" {
		s.zone.deletedAt[n.Name] = s.clock.Now()
	}
	var inUse []string
	for _, v := range n.Status.VolumesInUse {
		inUse = append(inUse, string(v))
	}
	s.deletedInUse[n.Name] = inUse
	s.w.remove(rNodes, n.Name)
	for _, o := range s.w.list(rPods) {
		if o.(*v1.Pod).Spec.NodeName == n.Name {
			s.w.remove(rPods, keyOf(o))
		}
	}
}

func (s *Sim) createPod(pv, node string) {
	s.podSeq++
	s.createPodNamed(fmt.Sprintf("p-%d", s.podSeq), pv, node)
}

func (s *Sim) createPodNamed(name, pv, node string) {
	s.podUIDs++
	uid := fmt.Sprintf("pod-%s-%d", name, s.podUIDs)
	s.podNode[uid] = node
	s.tracef("workload: pod %s (%s) on %s uses %s", name, uid, node, pv)
	s.w.create(rPods, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid),
			Annotations: map[string]string{"sim/pv": pv}},
		Spec: v1.PodSpec{NodeName: node, Volumes: []v1.Volume{{Name: "data",
			VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c-" + pv}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{
			{Name: "c", State: v1.ContainerState{Running: &v1.ContainerStateRunning{}}}}},
	})
}
