package sim

import (
	"os"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/controller"
)

// A node's managed annotation is removed and put back while the node
// informer is behind: each state is first seen in the answer to the
// controller's own node status write, and a relist then hands the informer
// the last version only (same management as it had cached). No volume may
// be left waiting for pods to be read again. The random runs reach this
// rarely; here it is driven step by step, with the world's own actors.
func TestManagementSeenFirstInStatusAnswers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Trace = true
	s := newSim(1, cfg)
	defer s.kill()
	// settle runs without faults until nothing is left to do; with
	// holdNodes, the node informer's events wait meanwhile.
	settle := func(holdNodes bool) {
		var held []event
		for range cfg.QuietSteps {
			if holdNodes {
				held = append(held, s.w.pending[rNodes]...)
				s.w.pending[rNodes] = nil
			}
			s.step++
			if !s.act(false) {
				break
			}
			s.checkEveryStep()
		}
		s.w.pending[rNodes] = append(held, s.w.pending[rNodes]...)
	}
	setManaged := func(on bool) {
		n := s.w.node(nodeName(0)).DeepCopy()
		n.Annotations = nil
		if on {
			n.Annotations = map[string]string{managed: "true"}
		}
		s.tracef("test: node-0 managed=%v", on)
		s.w.update(rNodes, n)
	}
	settle(false)
	s.createPod("rwx", nodeName(0))
	s.createPod("rwo-0", nodeName(0))
	settle(false)

	// Unmanaged; an attach on the node makes a status write, whose answer
	// is the first to say unmanaged.
	setManaged(false)
	s.createPod("rwo-1", nodeName(0))
	settle(true)
	// Managed again; a VolumeAttachment deleted by someone else makes
	// another status write, whose answer is the first to say managed.
	setManaged(true)
	for _, va := range s.w.attachments() {
		if attachmentVolume(va) == "rwx" && va.Spec.NodeName == nodeName(0) {
			s.deleteAttachmentAsThirdParty(va)
		}
	}
	settle(true)
	// The node informer relists: one update, managed as before.
	s.inf[rNodes].relist(s.w, rNodes)
	settle(false)
	// A volume of the node is wanted no more.
	s.w.remove(rPods, ns+"/"+podNamed(s, "rwo-0"))
	settle(false)
	s.heal()
	settle(false)
	s.checkQuiet()
	if len(s.violations) > 0 {
		t.Log(strings.Join(s.trace, "\n"))
		t.Errorf("violations: %q", s.violations)
	}
}

// podNamed returns the name of the live pod that uses pv.
func podNamed(s *Sim, pv string) string {
	for _, o := range s.w.list(rPods) {
		if p := o.(*v1.Pod); podPV(p) == pv && live(p) {
			return p.Name
		}
	}
	return ""
}

// A node's kubelet attached a volume by itself and mounted it, and the node
// turns managed before that kubelet reports the mount in use, and before
// the controller has read the pod that uses it (its event is in the
// informer, its sync not run yet). The node's facts say managed only once
// that pod is read: taken as unwanted before, the volume would be detached
// from under it. The random runs reach this rarely.
func TestManagedAgainBeforeItsPodsAreRead(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Trace = true
	s := newSim(1, cfg)
	defer s.kill()
	settle := func() {
		for range cfg.QuietSteps {
			s.step++
			if !s.act(false) {
				break
			}
			s.checkEveryStep()
		}
	}
	node := nodeName(0)
	setManaged := func(on bool) {
		n := s.w.node(node).DeepCopy()
		n.Annotations = nil
		if on {
			n.Annotations = map[string]string{managed: "true"}
		}
		s.tracef("test: %s managed=%v", node, on)
		s.w.update(rNodes, n)
	}
	kubelet := func(what string) {
		todo := s.kubeletAttaches(s.w.node(node))
		if len(todo) != 1 {
			t.Fatalf("kubelet %s: %d changes to make, want 1", what, len(todo))
		}
		todo[0]()
	}
	settle()
	// Its kubelet was told to attach by itself a while ago.
	setManaged(false)
	s.selfAttach[node] = s.clock.Now().Add(-seenWant)
	settle()
	s.createPod("rwx", node)
	kubelet("attach")
	s.attacher()
	kubelet("mount")
	// Managed again, its mount not reported in use yet; the pod's event
	// reaches the informer, and the pod worker waits.
	delete(s.selfAttach, node)
	setManaged(true)
	s.reportsHeld = true
	for len(s.w.pending[rPods]) > 0 {
		s.deliver(rPods)
	}
	workers := s.workers[controller.QueuePods]
	s.workers[controller.QueuePods] = 0
	settle()
	s.workers[controller.QueuePods] = workers
	s.reportsHeld = false
	settle()
	if !slices.ContainsFunc(s.w.attachments(), func(va *storagev1.VolumeAttachment) bool {
		return attachmentVolume(va) == "rwx" && va.Spec.NodeName == node && va.DeletionTimestamp == nil
	}) {
		t.Errorf("the volume its pod uses was detached from %s", node)
	}
	s.w.remove(rPods, ns+"/"+podNamed(s, "rwx"))
	settle()
	s.heal()
	settle()
	s.checkQuiet()
	if len(s.violations) > 0 || t.Failed() || os.Getenv("SIM_DEBUG") != "" {
		t.Log(strings.Join(s.trace, "\n"))
		t.Errorf("violations: %q", s.violations)
	}
}

// As TestManagedAgainBeforeItsPodsAreRead, with the pod's event still on
// its way to the informer when the node turns managed (the informer lists
// no pod there to wait for), and kubelet's status update that lists the
// mount not read yet either: the node version that carries the annotation
// back shows the volume not in use. For a while after a node is managed
// again (KubeletReportGrace, pkg/reconciler), a volume it does not list in use
// is not taken as unmounted: the pod and the report come meanwhile. Seed
// 17475 of the sweep found it (I2).
func TestManagedAgainBeforeItsPodIsInTheInformer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Trace = true
	s := newSim(1, cfg)
	defer s.kill()
	settle := func() {
		for range cfg.QuietSteps {
			s.step++
			if !s.act(false) {
				break
			}
			s.checkEveryStep()
		}
	}
	node := nodeName(0)
	setManaged := func(on bool) {
		n := s.w.node(node).DeepCopy()
		n.Annotations = nil
		if on {
			n.Annotations = map[string]string{managed: "true"}
		}
		s.tracef("test: %s managed=%v", node, on)
		s.w.update(rNodes, n)
	}
	kubelet := func(what string) {
		todo := s.kubeletAttaches(s.w.node(node))
		if len(todo) != 1 {
			t.Fatalf("kubelet %s: %d changes to make, want 1", what, len(todo))
		}
		todo[0]()
	}
	settle()
	// Its kubelet was told to attach by itself a while ago.
	setManaged(false)
	s.selfAttach[node] = s.clock.Now().Add(-seenWant)
	settle()
	// A pod comes; the pod informer's events are held from here.
	s.createPod("rwx", node)
	held := s.w.pending[rPods]
	s.w.pending[rPods] = nil
	kubelet("attach")
	s.attacher()
	kubelet("mount")
	// Managed again, its mount not reported in use yet. The controller
	// runs until it has nothing left to do but wait for time to pass.
	delete(s.selfAttach, node)
	setManaged(true)
	s.reportsHeld = true
	for range cfg.QuietSteps {
		if len(s.choices(false)) == 0 {
			break
		}
		s.step++
		s.act(false)
		s.checkEveryStep()
	}
	if s.w.pending[rPods] != nil {
		t.Fatalf("pod events came meanwhile: %d", len(s.w.pending[rPods]))
	}
	if !slices.ContainsFunc(s.w.attachments(), func(va *storagev1.VolumeAttachment) bool {
		return attachmentVolume(va) == "rwx" && va.Spec.NodeName == node && va.DeletionTimestamp == nil
	}) {
		t.Errorf("the volume its pod uses, mounted, was detached from %s before the pod and the report could be read", node)
	}
	// The report and the pod come.
	s.w.pending[rPods] = held
	s.reportsHeld = false
	settle()
	if !slices.ContainsFunc(s.w.attachments(), func(va *storagev1.VolumeAttachment) bool {
		return attachmentVolume(va) == "rwx" && va.Spec.NodeName == node && va.DeletionTimestamp == nil
	}) {
		t.Errorf("the volume its pod uses was detached from %s", node)
	}
	s.w.remove(rPods, ns+"/"+podNamed(s, "rwx"))
	settle()
	s.heal()
	settle()
	s.checkQuiet()
	if len(s.violations) > 0 || t.Failed() || os.Getenv("SIM_DEBUG") != "" {
		t.Log(strings.Join(s.trace, "\n"))
		t.Errorf("violations: %q", s.violations)
	}
}

// The delete of a volume's VolumeAttachment is refused (as an admission
// webhook refuses it) while its pod goes, and a pod on the same node wants
// the volume again: its kubelet lists it in volumesInUse before it is
// attached. The detach that started is never finished (it would wait for
// the volume to leave volumesInUse for good): what the API shows settles
// it, and the volume, never detached, is listed in node status again. The
// random runs reach this now and then (I4 or I5 before it was settled).
func TestRefusedDetachIsSettledForAPodThatWantsItAgain(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Trace = true
	s := newSim(1, cfg)
	defer s.kill()
	settle := func() {
		for range cfg.QuietSteps {
			s.step++
			if !s.act(false) {
				break
			}
			s.checkEveryStep()
		}
	}
	node := nodeName(0)
	settle()
	s.createPod("rwo-0", node)
	settle()
	const deletes = "delete volumeattachments"
	s.w.refused[deletes] = true
	s.w.remove(rPods, ns+"/"+podNamed(s, "rwo-0"))
	for s.stats["test: API write refused"] == 0 {
		s.step++
		if !s.act(false) {
			t.Fatalf("the detach of rwo-0 from %s was not tried", node)
		}
		s.checkEveryStep()
	}
	s.createPod("rwo-0", node)
	settle()
	delete(s.w.refused, deletes)
	settle()
	if s.w.node(node) == nil || !slices.Contains(attachedNames(s.w.node(node)), volumeNameOf(s, "rwo-0")) {
		t.Errorf("%s status does not list rwo-0, wanted there again", node)
	}
	s.heal()
	settle()
	s.checkQuiet()
	if len(s.violations) > 0 || t.Failed() || os.Getenv("SIM_DEBUG") != "" {
		t.Log(strings.Join(s.trace, "\n"))
		t.Errorf("violations: %q", s.violations)
	}
}

// attachedNames lists what a node's status lists attached.
func attachedNames(n *v1.Node) []string {
	var out []string
	for _, a := range n.Status.VolumesAttached {
		out = append(out, string(a.Name))
	}
	return out
}

// volumeNameOf is the unique name of the volume of PV pv.
func volumeNameOf(s *Sim, pv string) string { return s.volumeByPV(pv).names[0] }
