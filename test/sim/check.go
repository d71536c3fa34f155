package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
	"github.com/kube-attach/attach-detach-controller/test/invariants"
)

// The invariants, checked against the world (what the API holds and what
// the attachers did), never against the controller's own beliefs:
//
//	I1 a single-node volume has an attachment (a VolumeAttachment in any
//	   state, or an in-tree attachment) on one node at most;
//	I2 no detach starts for a volume in volumesInUse of a Ready node
//	   without the out-of-service taint, nor, on an unhealthy node, while a
//	   live pod there still uses it or before the max wait for unmount. A
//	   controller acts on what it saw a moment ago: the taint (or the
//	   node's unhealthiness) counts when it held at some moment since the
//	   volume stopped being wanted there, not only when the call is made.
//	   A pod's want counts once the running controller generation could
//	   read it (its claim and PV there, its node there, managed or not: the
//	   controller reads what pods want on every node): one whose claim
//	   went before it started names no volume it could know of. A volume a
//	   kubelet that attached by itself mounted counts as mounted before it
//	   is reported in use, for a live pod there whose pod, claim and PV
//	   the controller's informers hold;
//	I3 no detach starts while node.status.volumesAttached lists the volume;
//	I4 once no fault and no new work come, the run gets quiet within a
//	   bounded number of steps, and then every volume a live pod wants is
//	   attached where allowed and nothing nobody wants is attached;
//	I5 then, node.status.volumesAttached lists exactly what is attached;
//	I6 when a controller asked to stop says it has handed over, every
//	   attachment on an existing node (a VolumeAttachment, an in-tree
//	   attachment) is attached, not being detached, and listed in its node's
//	   status: what kube-controller-manager needs to count it.
//	I7 no detach starts for a volume a live pod on that node has wanted
//	   long enough to be seen (seenWant), mounted yet or not, whatever the
//	   node's health: the pod is starting on it, or its node is down with
//	   the pod still there, and the detach only makes it wait for a new
//	   attach, or (on a node that comes back) pulls the volume from under it.
//	I8 once quiet, every VolumeAttachment the running controller generation
//	   created, attached for a live pod on its node, has been announced: a
//	   SuccessfulAttachVolume event for its volume to a pod on that node,
//	   also when the attach was seen complete before the create's answer
//	   came (what a restarted controller finds attached needs none).
//	I9 no detach starts before a controller that started has read every pod
//	   (a pod not read yet may want the volume).
//	I10 no forced detach by timeout starts on a node of a zone disrupted for
//	   a while (zones.go).
//	I11 once faults stop, a move (a single-node volume a pod on another
//	   node now wants) completes within a bound of simulated time once
//	   nothing holds it back (moves.go).

// checkEveryStep checks I1 and keeps the bookkeeping I2 needs.
func (s *Sim) checkEveryStep() {
	s.checkSingleNode()
	s.noteWants()
	wanted := s.wantedKnown()
	now := s.clock.Now()
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node)
		if outOfServiceTaint(n) {
			s.taintSeen[n.Name] = now
		}
		if !ready(n) {
			s.unhealthySeen[n.Name] = now
		}
	}
	for name := range s.deletedNodes {
		s.unhealthySeen[name] = now
		s.deletedSeen[name] = now
	}
	s.noteZone()
	s.noteManaged()
	// The max wait runs from when the volume stopped being wanted. A want
	// starts it afresh only when it lasted long enough to be seen (a pod
	// that lived only while its events were in flight may never be seen;
	// a live pod's volume is guarded by the rule of its own).
	for _, v := range s.vols {
		for i := range s.cfg.Nodes {
			p := pair{v.pv, nodeName(i)}
			if !wanted[p] {
				delete(s.wantedSince, p)
				if _, ok := s.unwantedSince[p]; !ok {
					s.unwantedSince[p] = now
				}
				continue
			}
			if _, ok := s.wantedSince[p]; !ok {
				s.wantedSince[p] = now
			}
			if now.Sub(s.wantedSince[p]) >= seenWant {
				delete(s.unwantedSince, p)
			}
		}
	}
}

// seenWant is how long a want lasts before the controller must have seen
// it; informerLag bounds how late a watch event is delivered, workLag how
// long a queued item waits for a worker.
const (
	seenWant    = 30 * time.Second
	informerLag = 10 * time.Second
	workLag     = 5 * time.Second
)

// attachedNodes returns, per PV, the nodes holding an attachment of it.
func (s *Sim) attachedNodes() map[string][]string {
	out := map[string][]string{}
	add := func(pv, node string) {
		if !slices.Contains(out[pv], node) {
			out[pv] = append(out[pv], node)
		}
	}
	for _, va := range s.w.attachments() {
		add(attachmentVolume(va), va.Spec.NodeName)
	}
	for node, names := range s.intree {
		for name := range names {
			add(s.volumeByName(name).pv, node)
		}
	}
	return out
}

func (s *Sim) checkSingleNode() {
	for pv, nodes := range s.attachedNodes() {
		if v := s.volumeByPV(pv); v != nil {
			if on, bad := invariants.SingleNode(v.inv(), nodes); bad {
				s.violate("I1", "single-node volume %s attached to nodes %s", pv, on)
			}
		}
	}
}

func (s *Sim) checkAttachmentCreated(*storagev1.VolumeAttachment) { s.checkSingleNode() }

// checkDetachStart checks I2, I3, I7 and I9 at the moment a detach of pv
// from node starts.
func (s *Sim) checkDetachStart(pv, node string) {
	if s.recovery != nil {
		s.violate("I9", "detach of %s from %s started before the controller read every pod after its start", pv, node)
	}
	v := s.volumeByPV(pv)
	if v == nil {
		return
	}
	n := s.w.node(node)
	listed := v.inv().ListedIn
	var inUse, attached []string
	if n != nil {
		attached, inUse = invariants.NodeLists(n)
	} else {
		inUse = s.deletedInUse[node]
	}
	// What a third party listed since the controller's last status write
	// is not the controller's doing (if it stays, I5 finds it).
	if invariants.DetachListed(v.inv(), slices.DeleteFunc(attached, func(x string) bool { return s.thirdPartyListed[node][x] })) {
		s.violate("I3", "detach of %s from %s started while node.status.volumesAttached lists it", pv, node)
	}
	if !listed(inUse) && s.selfMounted[node][v.names[0]] && s.informedUse(pv, node) {
		s.violate("I2", "detach of %s from node %s started while a live pod there uses it (mounted by a kubelet that attached it by itself, not reported in use yet)", pv, node)
	}
	// Kubelet lists a volume in use as soon as a pod wants it, before it is
	// attached, and mounts it only once it is listed there and a fresh read
	// of node.status.volumesAttached lists it: a volume mounted was listed
	// in use before the controller's last listing of it in volumesAttached,
	// which the controller withdraws (and reads the answer of) before it
	// detaches. One listed in use and not mounted (never listed in
	// volumesAttached since, or withdrawn before kubelet could mount it)
	// is detached when the controller decided on node facts older than the
	// listing; kube-controller-manager reads the node again just before a
	// detach and waits for kubelet's next status update. Harmless: counted,
	// and judged as not in use.
	mountedListed := listed(inUse)
	if mountedListed && !s.mountedOn(v, node) {
		s.stats[statInUseNotMounted]++
		s.tracef("  detach of %s from %s: listed in volumesInUse, not mounted", pv, node)
		mountedListed = false
	}
	if !mountedListed {
		if s.wantedFor(seenWant)[pair{pv, node}] {
			s.violate("I7", "detach of %s from node %s started while a live pod there has wanted it for %s or more (not mounted)",
				pv, node, seenWant)
		}
		return
	}
	since, unwanted := s.unwantedSince[pair{pv, node}]
	held := func(at map[string]time.Time) bool {
		t, ok := at[node]
		return ok && unwanted && !t.Before(since)
	}
	// A node whose Node object is gone waits the deleted node's max wait;
	// so may one deleted since, created again.
	maxWait := s.cfg.MaxWaitForUnmount
	switch {
	case n == nil:
		maxWait = s.deletedNodeWait()
	case held(s.deletedSeen):
		maxWait = min(maxWait, s.deletedNodeWait())
	}
	switch {
	case s.wantedFor(seenWant)[pair{pv, node}]:
		// Not even the out-of-service taint detaches the volume of a live
		// pod the controller has had time to see.
		s.violate("I2", "detach of %s from node %s started while a live pod there uses it", pv, node)
	case (n != nil && outOfServiceTaint(n)) || held(s.taintSeen):
	case s.wantedKnown()[pair{pv, node}]:
		s.violate("I2", "detach of %s from node %s started while a live pod there uses it", pv, node)
	case n != nil && ready(n) && !held(s.unhealthySeen):
		s.violate("I2", "detach of %s from %s started while it is mounted on a Ready node", pv, node)
	case s.clock.Now().Sub(since) < maxWait:
		s.violate("I2", "forced detach of %s from unhealthy node %s after %s, before the max wait for unmount (%s)",
			pv, node, s.clock.Now().Sub(since), maxWait)
	default:
		// A forced detach by timeout.
		s.checkZoneHold(pv, node)
	}
}

// mountedOn: node's kubelet has v mounted (for a pod, or as it attached it
// by itself).
func (s *Sim) mountedOn(v *simVolume, node string) bool {
	return len(s.mounts[node][kubeletName(v)]) > 0 || s.selfMounted[node][v.names[0]]
}

// statInUseNotMounted counts the detaches of a volume its node's kubelet
// lists in use and has not mounted.
const statInUseNotMounted = "detach of a volume listed in use, not mounted"

// informedUse: a live pod on node uses pv, and the controller's informers
// hold that pod, its claim and the PV: it can tell.
func (s *Sim) informedUse(pv, node string) bool {
	has := func(r, key string, uid types.UID) bool {
		o, ok, _ := s.inf[r].GetStore().GetByKey(key)
		return ok && o.(object).GetUID() == uid
	}
	claim, vol := s.w.get(rPVCs, ns+"/c-"+pv), s.w.get(rPVs, pv)
	if claim == nil || vol == nil || !has(rPVCs, keyOf(claim), claim.GetUID()) || !has(rPVs, pv, vol.GetUID()) {
		return false
	}
	for _, o := range s.w.list(rPods) {
		if p := o.(*v1.Pod); p.Spec.NodeName == node && live(p) && s.resolved(p) && podPV(p) == pv && has(rPods, keyOf(p), p.UID) {
			return true
		}
	}
	return false
}

// checkQuiet checks I4, I5 and I8 once nothing is left to do.
func (s *Sim) checkQuiet() {
	wanted := s.wanted()
	attached := s.attachedNodes()
	// Everything wanted is attached, unless a single-node volume is
	// attached on another node that also wants it.
	for p := range wanted {
		nodes := attached[p.pv]
		if slices.Contains(nodes, p.node) {
			continue
		}
		v := s.volumeByPV(p.pv)
		if v.singleNode && len(nodes) == 1 && wanted[pair{p.pv, nodes[0]}] {
			continue
		}
		s.violate("I4", "quiet, but %s is not attached to %s where a live pod wants it (attached to %v)%s", p.pv, p.node, nodes, s.says(p.pv, p.node))
		s.explain(p.pv)
	}
	// Nothing unwanted is attached, but a forced detach held in a zone
	// still disrupted by deletions.
	for pv, nodes := range attached {
		for _, node := range nodes {
			if !wanted[pair{pv, node}] && s.zoneHeld(pv, node) {
				s.stats["quiet: forced detach held by a zone disrupted by deletions"]++
				continue
			}
			if !wanted[pair{pv, node}] {
				gone := ""
				if s.w.node(node) == nil {
					gone = " (deleted)"
				}
				s.violate("I4", "quiet, but %s stays attached to %s%s where no live pod wants it%s", pv, node, gone, s.says(pv, node))
				s.explain(pv)
			}
		}
	}
	// node.status.volumesAttached is exactly what is attached there.
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node)
		var listed, want []string
		for _, a := range n.Status.VolumesAttached {
			listed = append(listed, string(a.Name))
		}
		for _, va := range s.w.attachments() {
			if va.Spec.NodeName == n.Name && va.Status.Attached && va.DeletionTimestamp == nil {
				want = append(want, s.attachedName(va))
			}
		}
		for name := range s.intree[n.Name] {
			want = append(want, name)
		}
		slices.Sort(listed)
		slices.Sort(want)
		if !slices.Equal(listed, want) {
			s.violate("I5", "quiet, but node %s status lists %v while %v is attached", n.Name, listed, want)
		}
	}
	for _, va := range s.w.attachments() {
		p := pair{attachmentVolume(va), va.Spec.NodeName}
		if va.Status.Attached && va.DeletionTimestamp == nil && wanted[p] && s.unannounced[p] == va.UID {
			s.violate("I8", "quiet, but the attach of %s to %s, attached for a live pod there, was never announced", p.pv, p.node)
		}
	}
}

// zoneHeld: a detach of pv from node may only be a forced one by timeout,
// and the node's zone is disrupted, deletions within the deleted node's max
// wait counted (after heal, no zone is disrupted by nodes not Ready alone):
// the guard rightly holds it. The node is deleted or not Ready, without the
// out-of-service taint, with the volume mounted.
func (s *Sim) zoneHeld(pv, node string) bool {
	v := s.volumeByPV(pv)
	n := s.w.node(node)
	inUse := s.deletedInUse[node]
	if n != nil {
		if ready(n) || outOfServiceTaint(n) {
			return false
		}
		_, inUse = invariants.NodeLists(n)
	}
	if v == nil || !v.inv().ListedIn(inUse) || s.cfg.ZoneGuardOff {
		return false
	}
	z := s.zoneHealth(s.zoneOf(node))
	return z.deleted > 0 && z.disrupted()
}

// attachedName is the unique name kubelet expects for a VolumeAttachment's
// volume: the CSI name.
func (s *Sim) attachedName(va *storagev1.VolumeAttachment) string {
	v := s.volumeByPV(attachmentVolume(va))
	for _, n := range v.names {
		if strings.HasPrefix(n, "kubernetes.io/csi/") {
			return n
		}
	}
	return fmt.Sprintf("?%s", va.Name)
}

// says is what the controller says it does with a volume on a node, under
// the volume's first name it has an opinion about, for a violation's text.
func (s *Sim) says(pv, node string) string {
	if s.ctrl == nil {
		return ""
	}
	for _, name := range s.volumeByPV(pv).names {
		if e := s.ctrl.Explain(cache.Key{Volume: volume.Name(name), Node: node}); e.State != "" || e.Desired {
			return fmt.Sprintf("; the controller: %s: %s", e.Action, e.Reason)
		}
	}
	return "; the controller knows nothing of it"
}

// explain traces what the controller says of a volume on every node.
func (s *Sim) explain(pv string) {
	if s.ctrl == nil {
		return
	}
	for _, name := range s.volumeByPV(pv).names {
		for i := range s.cfg.Nodes {
			e := s.ctrl.Explain(cache.Key{Volume: volume.Name(name), Node: nodeName(i)})
			if e.State != "" || e.Desired {
				s.tracef("  explain %s@%s: %+v", name, nodeName(i), e)
			}
		}
	}
}

// explainChanges traces what the controller says of a volume on each node
// whenever that changed.
func (s *Sim) explainChanges(pv string) {
	if s.ctrl == nil {
		return
	}
	for _, name := range s.volumeByPV(pv).names {
		for i := range s.cfg.Nodes {
			k := cache.Key{Volume: volume.Name(name), Node: nodeName(i)}
			e := s.ctrl.Explain(k)
			line := fmt.Sprintf("%s: %s desired=%v pods=%v state=%q reported=%v error=%q", e.Action, e.Reason, e.Desired, e.Pods, e.State, e.Reported, e.Error)
			if s.explained[k] != line {
				s.explained[k] = line
				s.tracef("  explain %s@%s: %s", name, k.Node, line)
			}
		}
	}
}

// checkHandedOver checks I6.
func (s *Sim) checkHandedOver() {
	// Of a volume a third party took out of (or listed in) a node's status
	// since the controller's last write there, or of a VolumeAttachment it
	// created or deleted and whose event the controller has not read yet,
	// the controller may know nothing.
	listed := func(n *v1.Node, pv string) bool {
		v := s.volumeByPV(pv)
		return v != nil && (slices.ContainsFunc(v.names, func(x string) bool { return s.thirdPartyListed[n.Name][x] }) ||
			slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool {
				return slices.Contains(v.names, string(a.Name))
			}))
	}
	unread := func(va *storagev1.VolumeAttachment) bool {
		o, ok, _ := s.inf[rAttachments].GetStore().GetByKey(va.Name)
		return s.thirdPartyVA[va.Name] && (!ok || o.(*storagev1.VolumeAttachment).ResourceVersion != va.ResourceVersion)
	}
	// Nor can anyone tell which volume an attachment of a PV the
	// controller does not have attaches.
	pvUnknown := func(va *storagev1.VolumeAttachment) bool {
		pv := va.Spec.Source.PersistentVolumeName
		if pv == nil {
			return false
		}
		_, ok, _ := s.inf[rPVs].GetStore().GetByKey(*pv)
		return !ok || s.w.get(rPVs, *pv) == nil
	}
	// A node the controller has not seen yet (created again while its event
	// is in flight) has no status it could have written.
	seen := func(n *v1.Node) bool {
		o, ok, _ := s.inf[rNodes].GetStore().GetByKey(n.Name)
		return ok && o.(*v1.Node).UID == n.UID
	}
	for _, va := range s.w.attachments() {
		n := s.w.node(va.Spec.NodeName)
		// A node whose kubelet attaches by itself is nobody's to hand over.
		if n == nil || !seen(n) || unread(va) || pvUnknown(va) || s.toldToAttach(n.Name) {
			continue
		}
		pv := attachmentVolume(va)
		switch {
		case va.DeletionTimestamp != nil:
			s.violate("I6", "handed over with the detach of %s from %s under way", pv, n.Name)
		case !va.Status.Attached:
			s.violate("I6", "handed over with the attach of %s to %s under way", pv, n.Name)
		case !listed(n, pv):
			s.violate("I6", "handed over with %s attached to %s but not in its node status", pv, n.Name)
		}
	}
	for node, names := range s.intree {
		n := s.w.node(node)
		if n == nil || !seen(n) {
			continue
		}
		for name := range names {
			if pv := s.volumeByName(name).pv; !listed(n, pv) {
				s.violate("I6", "handed over with in-tree %s attached to %s but not in its node status", pv, node)
			}
		}
	}
}
