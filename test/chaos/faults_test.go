package chaos

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The faults of third parties writing what the controller owns, and of
// watches that cannot resume.
const (
	faultDeleteInUse   = "VolumeAttachment in use deleted by a third party"
	faultDeleteWaited  = "Multi-Attach: the VolumeAttachment in use deleted by a third party"
	faultDeleteFailing = "attach failing, Multi-Attach: the VolumeAttachment deleted by an admin"
	faultStatusEntry   = "volumesAttached entry removed or added by a third party"
	faultCompacted     = "etcd compacted behind a kube-apiserver restart"
	faultWatchesCut    = "watches of the controller cut, etcd compacted"
)

// deleteAttachment deletes va as a third party would, only if it has not
// changed since read (so that a delete the controller made first is not
// taken for the third party's), and tells the checker. It reads it again
// and retries when it changed but is not being deleted.
func (h *harness) deleteAttachment(va *storagev1.VolumeAttachment, why string) bool {
	h.t.Helper()
	vas := h.client.StorageV1().VolumeAttachments()
	name := va.Name
	for range 5 {
		if va.DeletionTimestamp != nil {
			h.note("VolumeAttachment %s (%s) already being deleted: not deleted by the third party", name, why)
			return false
		}
		err := vas.Delete(h.ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &va.UID, ResourceVersion: &va.ResourceVersion}})
		switch {
		case err == nil:
			h.checker.DeletedByOthers(va.UID)
			h.note("third party deleted VolumeAttachment %s (uid %s, %s, attached=%v)", name, va.UID, why, va.Status.Attached)
			return true
		case apierrors.IsConflict(err):
			got, getErr := vas.Get(h.ctx, name, metav1.GetOptions{})
			if getErr == nil {
				va = got
				continue
			}
			err = getErr
		}
		if !apierrors.IsNotFound(err) {
			h.t.Fatalf("delete VolumeAttachment %s: %v", name, err)
		}
		h.note("VolumeAttachment %s (%s) gone before the third party deleted it", name, why)
		return false
	}
	h.note("VolumeAttachment %s (%s) kept changing: not deleted by the third party", name, why)
	return false
}

// mounted returns the VolumeAttachment of v on node if it is attached and
// node's volumesInUse lists v, else nil.
func (h *harness) mounted(v chaosVolume, node string) *storagev1.VolumeAttachment {
	va, err := h.client.StorageV1().VolumeAttachments().Get(h.ctx, framework.VolumeAttachmentName(v.handle, v.driver, node), metav1.GetOptions{})
	if err != nil || !va.Status.Attached || va.DeletionTimestamp != nil {
		return nil
	}
	n, err := h.client.CoreV1().Nodes().Get(h.ctx, node, metav1.GetOptions{})
	if err != nil || !slices.ContainsFunc(n.Status.VolumesInUse, func(u v1.UniqueVolumeName) bool { return slices.Contains(v.Names, string(u)) }) {
		return nil
	}
	return va
}

// waitMounted waits a little for v to be attached to node and mounted
// there; nil if it is not (a fault may be in the way).
func (h *harness) waitMounted(v chaosVolume, node string) *storagev1.VolumeAttachment {
	h.t.Helper()
	var va *storagev1.VolumeAttachment
	framework.Poll(h.t, 30*time.Second, func() (bool, error) {
		va = h.mounted(v, node)
		return va != nil, nil
	})
	return va
}

// deleteInUse deletes the VolumeAttachment of a volume a live pod has
// mounted: the controller must attach it again, and nothing may detach the
// volume anywhere else meanwhile.
func (h *harness) deleteInUse() {
	h.t.Helper()
	pods := h.pods()
	for _, i := range h.rng.Perm(len(h.volumes)) {
		v := h.volumes[i]
		for _, p := range pods[v.claim] {
			if va := h.mounted(v, p.Spec.NodeName); va != nil {
				h.deleteAttachment(va, "in use by pod "+p.Name)
				return
			}
		}
	}
	// Nothing mounted yet: a pod is started and waited for.
	for _, i := range h.rng.Perm(len(h.volumes)) {
		v := h.volumes[i]
		if len(pods[v.claim]) > 0 && !v.rwx {
			continue
		}
		n := h.node()
		pod := h.createPod(v.claim, n)
		h.note("pod %s of %s created on %s, for its VolumeAttachment to be deleted", pod, v.claim, n)
		if va := h.waitMounted(v, n); va != nil {
			h.deleteAttachment(va, "in use by pod "+pod)
		}
		return
	}
}

// multiAttach: a ReadWriteOnce volume's pod on one node, attached (or, when
// failing, its attach failing), a second pod on another node waiting for
// it; a third party deletes the VolumeAttachment of the first node (an
// admin unsticking a failing attach, or kube-controller-manager during a
// cut-over). The controller must never attach the volume to both nodes.
// Then one of the pods goes, chosen at random, so that the volume can
// settle.
func (h *harness) multiAttach(failing bool) {
	h.t.Helper()
	var candidates []chaosVolume
	for _, v := range h.volumes {
		// A failing attach is made by the node ID of the mock driver.
		if v.SingleNode && (!failing || v.driver == stack.MockDriver) {
			candidates = append(candidates, v)
		}
	}
	v := candidates[h.rng.Intn(len(candidates))]
	pods := h.pods()[v.claim]
	var first, a string
	if len(pods) > 0 && !failing {
		first, a = pods[0].Name, pods[0].Spec.NodeName
	} else {
		// A fresh attach on a node none of its pods is on.
		var busy []string
		for _, p := range pods {
			busy = append(busy, p.Spec.NodeName)
			h.deletePod(p.Name, nil)
		}
		a = h.otherNode(busy...)
		if failing {
			h.breakAttach(a, v.driver)
		}
		first = h.createPod(v.claim, a)
	}
	name := framework.VolumeAttachmentName(v.handle, v.driver, a)
	var va *storagev1.VolumeAttachment
	framework.Poll(h.t, 30*time.Second, func() (bool, error) {
		got, err := h.client.StorageV1().VolumeAttachments().Get(h.ctx, name, metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp != nil {
			return false, nil
		}
		va = got
		if failing {
			return got.Status.AttachError != nil, nil
		}
		return got.Status.Attached, nil
	})
	b := h.otherNode(a)
	second := h.createPod(v.claim, b)
	h.note("%s: pod %s on %s (attached=%v, attach error=%v), pod %s on %s waits", v.claim, first, a,
		va != nil && va.Status.Attached, va != nil && va.Status.AttachError != nil, second, b)
	// The controller reads the waiting pod before the delete, or not.
	h.sleep(time.Duration(h.rng.Intn(3000)) * time.Millisecond)
	if va, err := h.client.StorageV1().VolumeAttachments().Get(h.ctx, name, metav1.GetOptions{}); err == nil {
		h.deleteAttachment(va, fmt.Sprintf("pod %s waits on %s", second, b))
	} else {
		h.note("no VolumeAttachment %s to delete: %v", name, err)
	}
	h.sleep(time.Duration(h.rng.Intn(4000)) * time.Millisecond)
	if failing {
		h.repairAttach(a, v.driver)
	}
	loser := first
	if h.rng.Intn(2) == 0 {
		loser = second
	}
	h.deletePod(loser, nil)
	h.note("pod %s of %s deleted: the other one keeps the volume", loser, v.claim)
}

// otherNode returns a node not among those given.
func (h *harness) otherNode(not ...string) string {
	for {
		if n := h.node(); !slices.Contains(not, n) {
			return n
		}
	}
}

// unreachableID is a node ID the mock driver does not know: ControllerPublish
// to it fails with NotFound, ControllerUnpublish "succeeds".
const unreachableID = "unreachable"

// breakAttach makes every attach of driver to node fail: the node's CSINode
// names another node ID for the driver (an entry's node ID is immutable:
// the entry is removed, then added back).
func (h *harness) breakAttach(node, driver string) {
	h.t.Helper()
	h.setNodeID(node, driver, unreachableID)
}

// repairAttach undoes breakAttach (kubeletsim registers the mock drivers
// with their own name as node ID).
func (h *harness) repairAttach(node, driver string) {
	h.t.Helper()
	h.setNodeID(node, driver, driver)
}

func (h *harness) setNodeID(node, driver, id string) {
	h.t.Helper()
	csiNodes := h.client.StorageV1().CSINodes()
	for _, with := range []bool{false, true} {
		framework.Eventually(h.t, 30*time.Second, func() (bool, error) {
			cn, err := csiNodes.Get(h.ctx, node, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			i := slices.IndexFunc(cn.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver })
			if with && i >= 0 && cn.Spec.Drivers[i].NodeID == id || !with && (i < 0 || cn.Spec.Drivers[i].NodeID == id) {
				return true, nil
			}
			if with {
				cn.Spec.Drivers = append(cn.Spec.Drivers, storagev1.CSINodeDriver{Name: driver, NodeID: id})
			} else {
				cn.Spec.Drivers = slices.Delete(cn.Spec.Drivers, i, i+1)
			}
			_, err = csiNodes.Update(h.ctx, cn, metav1.UpdateOptions{})
			return err == nil, nil
		}, "CSINode %s: driver %s with node ID %s", node, driver, id)
	}
	h.note("CSINode %s: driver %s has node ID %q", node, driver, id)
}

// statusEntry removes an entry of a harness volume from a node's
// volumesAttached, or adds one of a volume not attached there, as
// kube-controller-manager may during a cut-over: the controller must put
// the list right.
func (h *harness) statusEntry() {
	h.t.Helper()
	nodes := h.client.CoreV1().Nodes()
	framework.Eventually(h.t, 30*time.Second, func() (bool, error) {
		n, err := nodes.Get(h.ctx, h.node(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		ours := func(name v1.UniqueVolumeName) bool {
			return slices.ContainsFunc(h.volumes, func(v chaosVolume) bool { return slices.Contains(v.Names, string(name)) })
		}
		var listed []int
		for i, a := range n.Status.VolumesAttached {
			if ours(a.Name) {
				listed = append(listed, i)
			}
		}
		var change string
		if len(listed) > 0 && h.rng.Intn(2) == 0 {
			i := listed[h.rng.Intn(len(listed))]
			change = "removed " + string(n.Status.VolumesAttached[i].Name)
			n.Status.VolumesAttached = slices.Delete(n.Status.VolumesAttached, i, i+1)
		} else {
			var absent []chaosVolume
			for _, v := range h.volumes {
				_, err := h.client.StorageV1().VolumeAttachments().Get(h.ctx, framework.VolumeAttachmentName(v.handle, v.driver, n.Name), metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					absent = append(absent, v)
				}
			}
			if len(absent) == 0 {
				return false, nil
			}
			v := absent[h.rng.Intn(len(absent))]
			change = "added " + v.Names[0]
			n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: v1.UniqueVolumeName(v.Names[0])})
		}
		// The whole status, at the version read: a write the controller
		// made meanwhile is not undone.
		if _, err := nodes.UpdateStatus(h.ctx, n, metav1.UpdateOptions{}); err != nil {
			return false, nil
		}
		h.note("third party %s in node %s's volumesAttached", change, n.Name)
		return true, nil
	}, "a third party's change to a node's volumesAttached")
}

// forget deletes, as the controller's watches cannot see, a pod at once
// (grace period 0) and the VolumeAttachment of a mounted volume: their
// deletions reach the controller's informers as tombstones of a relist.
func (h *harness) forget() {
	h.t.Helper()
	zero := int64(0)
	pods := h.pods()
	for _, i := range h.rng.Perm(len(h.volumes)) {
		if ps := pods[h.volumes[i].claim]; len(ps) > 0 {
			h.deletePod(ps[0].Name, &zero)
			h.note("pod %s of %s on %s deleted at once", ps[0].Name, h.volumes[i].claim, ps[0].Spec.NodeName)
			break
		}
	}
	pods = h.pods()
	for _, i := range h.rng.Perm(len(h.volumes)) {
		v := h.volumes[i]
		for _, p := range pods[v.claim] {
			if p.DeletionTimestamp != nil {
				continue
			}
			if va := h.mounted(v, p.Spec.NodeName); va != nil && h.deleteAttachment(va, "in use by pod "+p.Name) {
				return
			}
		}
	}
}

// relistMark is what the leader's informers had listed (the controller
// logs "Caches populated" at -v=2 for each list; those of the ConfigMaps
// the secure port's authentication reads are not the controller's) and how
// often the checker's watches had listed again, before a fault.
type relistMark struct {
	leader  *stack.Controller
	lists   []string // the type of each list, in order
	checker int64
}

func (h *harness) markRelists() relistMark {
	m := relistMark{leader: h.leader(), checker: h.relists.Load()}
	if m.leader != nil {
		m.lists = informerLists(m.leader.Output())
	}
	return m
}

// relisted returns how many lists the leader's informers made since m, and
// whether every type listed before m was listed again; false, false if
// another replica leads now (a new leader's first lists are not relists).
func (h *harness) relisted(m relistMark) (lists int, all, same bool) {
	if m.leader == nil || h.leader() != m.leader {
		return 0, false, false
	}
	now := informerLists(m.leader.Output())
	since := now[min(len(m.lists), len(now)):]
	all = true
	for _, typ := range m.lists {
		if !slices.Contains(since, typ) {
			all = false
			break
		}
	}
	return len(since), all, true
}

// awaitRelists waits until every informer of the leader has listed again
// since m, so that a fault meant to force relists has done so before
// convergence is judged.
func (h *harness) awaitRelists(m relistMark) {
	h.t.Helper()
	var all, same bool
	framework.Poll(h.t, 90*time.Second, func() (bool, error) {
		_, all, same = h.relisted(m)
		return all || !same, nil
	})
	switch {
	case !same:
		h.note("another replica leads: the informers that listed again are not known")
	case !all:
		h.note("not every informer of the leader listed again")
	default:
		h.note("every informer of the leader listed again")
	}
}

// countRelists adds the lists made since m to the fault kind's count.
func (h *harness) countRelists(kind string, m relistMark) {
	r := h.relistsCaused[kind]
	r.checker += h.relists.Load() - m.checker
	if n, _, same := h.relisted(m); same {
		r.controller += n
	} else {
		r.leaderChanged++
	}
	h.relistsCaused[kind] = r
}

// informerLists returns the type of each list in a controller's log.
func informerLists(log string) []string {
	var types []string
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"Caches populated"`) || strings.Contains(line, `type="*v1.ConfigMap"`) {
			continue
		}
		_, typ, _ := strings.Cut(line, ` type="`)
		typ, _, _ = strings.Cut(typ, `"`)
		types = append(types, typ)
	}
	return types
}

// relistCount is what one kind of fault made the watches do.
type relistCount struct {
	controller    int
	checker       int64
	leaderChanged int
}

// checkRelists fails the run when a fault made to force relists did not:
// it would prove nothing.
func (h *harness) checkRelists() {
	h.t.Helper()
	if r, n := h.relistsCaused[faultWatchesCut], h.faults[faultWatchesCut]; n > r.leaderChanged && r.controller == 0 {
		h.t.Errorf("%d faults %q made the leader list nothing again", n, faultWatchesCut)
	}
	if n := h.faults[faultCompacted]; n > 0 && h.relistsCaused[faultCompacted].checker == 0 {
		h.t.Errorf("%d faults %q made no watch of the checker list again", n, faultCompacted)
	}
}
