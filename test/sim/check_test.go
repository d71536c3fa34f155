package sim

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The checker must catch each violation planted on purpose, and find
// nothing in a world that is right.
func TestCheckerCatchesPlantedViolations(t *testing.T) {
	rwo0 := "kubernetes.io/csi/" + csiDriver + "^h-rwo-0"
	attach := func(s *Sim, node string) *storagev1.VolumeAttachment {
		pv := "rwo-0"
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: "planted-" + node},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: csiDriver, NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
			Status: storagev1.VolumeAttachmentStatus{Attached: true},
		}
		s.w.create(rAttachments, va)
		return va
	}
	// setNode changes a node; what it lists in use, its kubelet has
	// mounted.
	setNode := func(s *Sim, name string, f func(n *v1.Node)) {
		n := s.w.node(name).DeepCopy()
		f(n)
		for _, v := range n.Status.VolumesInUse {
			if s.mounts[name] == nil {
				s.mounts[name] = map[string]map[string]bool{}
			}
			s.mounts[name][string(v)] = map[string]bool{"planted": true}
		}
		s.w.update(rNodes, n)
	}
	listed := func(n *v1.Node) {
		n.Status.VolumesAttached = []v1.AttachedVolume{{Name: v1.UniqueVolumeName(rwo0)}}
	}
	mounted := func(n *v1.Node) { n.Status.VolumesInUse = []v1.UniqueVolumeName{v1.UniqueVolumeName(rwo0)} }
	// attachedByController: a pod's volume attached and listed in its node's status
	// by an attach of the running controller, not announced yet.
	attachedByController := func(s *Sim) {
		s.createPod("rwo-0", nodeName(0))
		va := attach(s, nodeName(0))
		setNode(s, nodeName(0), listed)
		s.unannounced[pair{"rwo-0", nodeName(0)}] = va.UID
	}
	notReady := func(n *v1.Node) {
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse}}
	}

	// In a world of two zones of four nodes: zone "a" holds the even
	// nodes, zone "b" the odd ones.
	twoZones := func(c *Config) { c.Nodes, c.Zones = 8, 2 }
	fourNodes := func(c *Config) { c.Nodes = 4 }
	// mountedOn: rwo-0 attached to node, listed and mounted there, its pod
	// gone.
	mountedOn := func(s *Sim, node string) {
		attach(s, node)
		setNode(s, node, func(n *v1.Node) { listed(n); mounted(n) })
	}
	later := func(s *Sim, d time.Duration) {
		s.checkEveryStep()
		s.clock.SetTime(s.clock.Now().Add(d))
		s.checkEveryStep()
	}
	// moveFrom0To1: rwo-0 attached to node-0 and listed there, not in use
	// (its kubelet has unmounted it), and wanted by a new pod on node-1;
	// quiet lets d pass with the moves' clocks (I11) kept before and after.
	moveFrom0To1 := func(s *Sim) {
		for len(s.recovered) > 0 {
			s.feedRecovered()
		}
		attach(s, nodeName(0))
		setNode(s, nodeName(0), listed)
		s.createPod("rwo-0", nodeName(1))
	}
	quiet := func(s *Sim, d time.Duration) {
		s.checkMoves()
		s.clock.SetTime(s.clock.Now().Add(d))
		s.checkMoves()
	}

	for _, tc := range []struct {
		name  string
		cfg   func(c *Config)
		plant func(s *Sim)
		want  string // the invariant reported; empty: none
	}{
		{"a right world", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			setNode(s, nodeName(0), func(n *v1.Node) { listed(n); mounted(n) })
			s.checkEveryStep()
			s.checkQuiet()
			s.checkHandedOver()
		}, ""},
		{"I1: RWO volume attached to two nodes", nil, func(s *Sim) {
			attach(s, nodeName(0))
			attach(s, nodeName(1))
			s.checkEveryStep()
		}, "I1"},
		{"I2: detach of a volume mounted on a Ready node", nil, func(s *Sim) {
			attach(s, nodeName(0))
			setNode(s, nodeName(0), mounted)
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I2"},
		{"I2: none for a volume its kubelet lists in use and has not mounted (counted)", nil, func(s *Sim) {
			attach(s, nodeName(0))
			n := s.w.node(nodeName(0)).DeepCopy()
			mounted(n)
			s.w.update(rNodes, n)
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
			if s.stats[statInUseNotMounted] != 1 {
				s.violate("test", "not counted: %v", s.stats)
			}
		}, ""},
		{"I2: forced detach from a NotReady node before the max wait", nil, func(s *Sim) {
			attach(s, nodeName(0))
			setNode(s, nodeName(0), func(n *v1.Node) { mounted(n); notReady(n) })
			s.checkEveryStep()
			s.clock.SetTime(s.clock.Now().Add(time.Minute))
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I2"},
		{"I2: detach of a volume a live pod uses on a NotReady node", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			setNode(s, nodeName(0), func(n *v1.Node) { mounted(n); notReady(n) })
			s.checkEveryStep()
			s.clock.SetTime(s.clock.Now().Add(time.Hour))
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I2"},
		{"I2: detach of a volume a live pod uses, decided under an out-of-service taint gone since", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			setNode(s, nodeName(0), mounted)
			s.checkEveryStep()
			// The claim goes after the running controller could read it:
			// the pod keeps its volume.
			s.w.remove(rPVCs, ns+"/c-rwo-0")
			s.checkEveryStep()
			setNode(s, nodeName(0), func(n *v1.Node) { n.Spec.Taints = []v1.Taint{{Key: outOfService, Effect: v1.TaintEffectNoExecute}} })
			s.checkEveryStep()
			setNode(s, nodeName(0), func(n *v1.Node) { n.Spec.Taints = nil })
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I2"},
		{"I2: none under an out-of-service taint gone since, for a pod whose claim went before the running controller started", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			setNode(s, nodeName(0), mounted)
			s.checkEveryStep()
			s.w.remove(rPVCs, ns+"/c-rwo-0")
			s.replace()
			for s.recovery != nil {
				s.readPods()
			}
			s.checkEveryStep()
			setNode(s, nodeName(0), func(n *v1.Node) { n.Spec.Taints = []v1.Taint{{Key: outOfService, Effect: v1.TaintEffectNoExecute}} })
			s.checkEveryStep()
			setNode(s, nodeName(0), func(n *v1.Node) { n.Spec.Taints = nil })
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, ""},
		{"I7: detach of a volume a live pod has long wanted, not mounted yet", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			s.checkEveryStep()
			s.clock.SetTime(s.clock.Now().Add(seenWant))
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I7"},
		{"I7: none for a pod whose claim went before the running controller started", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			s.checkEveryStep()
			s.w.remove(rPVCs, ns+"/c-rwo-0")
			s.replace()
			for s.recovery != nil {
				s.readPods()
			}
			s.clock.SetTime(s.clock.Now().Add(time.Hour))
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, ""},
		{"I7: a pod whose claim went after the running controller could read it", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			s.checkEveryStep()
			s.clock.SetTime(s.clock.Now().Add(seenWant))
			s.checkEveryStep()
			s.w.remove(rPVCs, ns+"/c-rwo-0")
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I7"},
		{"I7: a pod whose node was unmanaged while its claim was there (what pods want is read on every node)", nil, func(s *Sim) {
			setNode(s, nodeName(0), func(n *v1.Node) { n.Annotations = nil })
			s.createPod("rwo-0", nodeName(0))
			s.checkEveryStep()
			s.clock.SetTime(s.clock.Now().Add(seenWant))
			s.checkEveryStep()
			s.w.remove(rPVCs, ns+"/c-rwo-0")
			setNode(s, nodeName(0), func(n *v1.Node) { n.Annotations = map[string]string{managed: "true"} })
			s.clock.SetTime(s.clock.Now().Add(seenWant))
			s.checkEveryStep()
			attach(s, nodeName(0))
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I7"},
		{"I2: detach of a volume a kubelet mounted by itself, for a pod the controller's informer has", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			for len(s.w.pending[rPods]) > 0 {
				s.deliver(rPods)
			}
			attach(s, nodeName(0))
			s.selfMounted[nodeName(0)] = map[string]bool{rwo0: true}
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I2"},
		{"I2: none for a volume a kubelet mounted by itself, for a pod not in the controller's informer yet", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			s.selfMounted[nodeName(0)] = map[string]bool{rwo0: true}
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, ""},
		{"I7: none for a pod just created", nil, func(s *Sim) {
			attach(s, nodeName(0))
			s.createPod("rwo-0", nodeName(0))
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, ""},
		{"I3: detach while node status lists the volume", nil, func(s *Sim) {
			attach(s, nodeName(0))
			setNode(s, nodeName(0), listed)
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I3"},
		{"I3: none while what a third party listed since the controller's last write lists it", nil, func(s *Sim) {
			attach(s, nodeName(0))
			setNode(s, nodeName(0), listed)
			s.thirdPartyListed[nodeName(0)] = map[string]bool{rwo0: true}
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, ""},
		{"I3: once the controller's own status write listed it again", nil, func(s *Sim) {
			attach(s, nodeName(0))
			s.thirdPartyListed[nodeName(0)] = map[string]bool{rwo0: true}
			patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesAttached": []v1.AttachedVolume{{Name: v1.UniqueVolumeName(rwo0)}}}})
			if _, err := s.w.patchNodeStatus(nodeName(0), patch); err != nil {
				t.Fatal(err)
			}
			s.checkEveryStep()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I3"},
		{"I4: quiet with a VolumeAttachment nobody wants", nil, func(s *Sim) {
			attach(s, nodeName(0))
			setNode(s, nodeName(0), listed)
			s.checkQuiet()
		}, "I4"},
		{"I4: quiet with a wanted volume not attached", nil, func(s *Sim) {
			s.createPod("rwx", nodeName(1))
			s.checkQuiet()
		}, "I4"},
		{"I5: quiet with node status listing what is not attached", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			setNode(s, nodeName(1), listed)
			s.checkQuiet()
		}, "I5"},
		{"I8: quiet with an attach of this controller never announced", nil, func(s *Sim) {
			attachedByController(s)
			s.checkQuiet()
		}, "I8"},
		{"I8: none for one created again by someone else after the controller's was gone", nil, func(s *Sim) {
			attachedByController(s)
			s.w.remove(rAttachments, "planted-"+nodeName(0))
			attach(s, nodeName(0))
			s.checkQuiet()
		}, ""},
		{"I8: none once announced to the pod", nil, func(s *Sim) {
			attachedByController(s)
			(&recorder{s: s}).Event(&v1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "p-1", UID: s.w.get(rPods, ns+"/p-1").GetUID()}, v1.EventTypeNormal,
				"SuccessfulAttachVolume", `AttachVolume.Attach succeeded for volume "rwo-0" `)
			s.checkQuiet()
		}, ""},
		{"I9: detach while the controller still reads the pods", nil, func(s *Sim) {
			attach(s, nodeName(0))
			s.newController()
			_ = s.w.deleteAttachment("planted-"+nodeName(0), metav1.DeleteOptions{})
		}, "I9"},
		{"I6: handed over with a VolumeAttachment its node status does not list", nil, func(s *Sim) {
			attach(s, nodeName(0))
			s.checkHandedOver()
		}, "I6"},
		{"I6: none for a VolumeAttachment a third party created that the controller has not read", nil, func(s *Sim) {
			s.thirdPartyVA["planted-"+nodeName(0)] = true
			attach(s, nodeName(0))
			s.checkHandedOver()
		}, ""},
		{"I6: one a third party created that the controller has read", nil, func(s *Sim) {
			s.thirdPartyVA["planted-"+nodeName(0)] = true
			attach(s, nodeName(0))
			for len(s.w.pending[rAttachments]) > 0 {
				s.deliver(rAttachments)
			}
			s.checkHandedOver()
		}, "I6"},
		{"I6: none for a VolumeAttachment whose PV the controller does not have", nil, func(s *Sim) {
			attach(s, nodeName(0))
			s.w.remove(rPVs, "rwo-0")
			s.deliver(rPVs)
			s.createPV(*s.volumeByPV("rwo-0"))
			s.checkHandedOver()
		}, ""},
		{"I6: handed over with an attach under way", nil, func(s *Sim) {
			va := attach(s, nodeName(0)).DeepCopy()
			va.Status.Attached = false
			s.w.update(rAttachments, va)
			setNode(s, nodeName(0), listed)
			s.checkHandedOver()
		}, "I6"},
		{"I10: forced detach from a node of its disrupted zone, of two", twoZones, func(s *Sim) {
			mountedOn(s, nodeName(1))
			for _, i := range []int{1, 3, 5} {
				setNode(s, nodeName(i), notReady)
			}
			later(s, 2*time.Minute)
			setNode(s, nodeName(1), func(n *v1.Node) { n.Status.VolumesAttached = nil })
			_ = s.w.deleteAttachment("planted-"+nodeName(1), metav1.DeleteOptions{})
		}, "I10"},
		{"I10: none from a node of a zone not disrupted, the other one disrupted", twoZones, func(s *Sim) {
			mountedOn(s, nodeName(1))
			for _, i := range []int{1, 0, 2, 4} {
				setNode(s, nodeName(i), notReady)
			}
			later(s, 2*time.Minute)
			setNode(s, nodeName(1), func(n *v1.Node) { n.Status.VolumesAttached = nil })
			_ = s.w.deleteAttachment("planted-"+nodeName(1), metav1.DeleteOptions{})
		}, ""},
		{"I10: forced detach from a node deleted before the controller started, its zone disrupted", twoZones, func(s *Sim) {
			mountedOn(s, nodeName(1))
			s.deleteNode(s.w.node(nodeName(1)))
			s.replace()
			for s.recovery != nil {
				s.readPods()
			}
			for _, i := range []int{3, 5, 7} {
				setNode(s, nodeName(i), notReady)
			}
			later(s, 3*time.Minute)
			_ = s.w.deleteAttachment("planted-"+nodeName(1), metav1.DeleteOptions{})
		}, "I10"},
		{"I4: quiet with a volume attached to a node deleted, its max wait over", nil, func(s *Sim) {
			mountedOn(s, nodeName(0))
			s.deleteNode(s.w.node(nodeName(0)))
			later(s, time.Hour)
			s.checkQuiet()
		}, "I4"},
		{"I4: none for a forced detach held by a zone disrupted by deletions", fourNodes, func(s *Sim) {
			mountedOn(s, nodeName(0))
			setNode(s, nodeName(0), notReady)
			s.deleteNode(s.w.node(nodeName(1)))
			s.deleteNode(s.w.node(nodeName(2)))
			later(s, time.Minute)
			s.checkQuiet()
		}, ""},
		{"I4: a forced detach held once the deletions no longer count", fourNodes, func(s *Sim) {
			mountedOn(s, nodeName(0))
			setNode(s, nodeName(0), notReady)
			s.deleteNode(s.w.node(nodeName(1)))
			s.deleteNode(s.w.node(nodeName(2)))
			later(s, time.Hour)
			s.checkQuiet()
		}, "I4"},
		{"I4: a forced detach held by a zone of nodes not Ready, none deleted", fourNodes, func(s *Sim) {
			mountedOn(s, nodeName(0))
			for _, i := range []int{0, 1, 2} {
				setNode(s, nodeName(i), notReady)
			}
			later(s, time.Minute)
			s.checkQuiet()
		}, "I4"},
		{"I11: a move its new node's status never lists, nothing holding it back", nil, func(s *Sim) {
			moveFrom0To1(s)
			quiet(s, moveBound+time.Second)
		}, "I11"},
		{"I11: none for a move listed within the bound", nil, func(s *Sim) {
			moveFrom0To1(s)
			quiet(s, moveBound)
			s.w.remove(rAttachments, "planted-"+nodeName(0))
			attach(s, nodeName(1))
			setNode(s, nodeName(1), listed)
			quiet(s, time.Hour)
		}, ""},
		{"I11: none while the old node has it mounted", nil, func(s *Sim) {
			moveFrom0To1(s)
			setNode(s, nodeName(0), mounted)
			quiet(s, time.Hour)
		}, ""},
		{"I11: the bound runs from the old kubelet's unmount", nil, func(s *Sim) {
			moveFrom0To1(s)
			setNode(s, nodeName(0), mounted)
			quiet(s, time.Hour)
			setNode(s, nodeName(0), func(n *v1.Node) { n.Status.VolumesInUse = nil })
			quiet(s, moveBound+time.Second)
		}, "I11"},
		{"I11: none while the old node is not Ready", nil, func(s *Sim) {
			moveFrom0To1(s)
			setNode(s, nodeName(0), notReady)
			quiet(s, time.Hour)
		}, ""},
		{"I11: none while the new node is not Ready", nil, func(s *Sim) {
			moveFrom0To1(s)
			setNode(s, nodeName(1), notReady)
			quiet(s, time.Hour)
		}, ""},
		{"I11: none for a volume pods on two nodes want", nil, func(s *Sim) {
			moveFrom0To1(s)
			s.createPod("rwo-0", nodeName(2))
			quiet(s, time.Hour)
		}, ""},
		{"I11: none while faults go on", nil, func(s *Sim) {
			moveFrom0To1(s)
			s.faults = true
			quiet(s, time.Hour)
		}, ""},
		{"I11: none while the controller reads its pods after a start", nil, func(s *Sim) {
			moveFrom0To1(s)
			s.replace()
			quiet(s, time.Hour)
		}, ""},
		{"I11: an attach of a volume attached nowhere else", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(1))
			quiet(s, moveBound+time.Second)
		}, "I11"},
		{"I4: quiet with a pod's volume whose VolumeAttachment a third party deleted before the informer showed it", nil, func(s *Sim) {
			s.createPod("rwo-0", nodeName(0))
			attach(s, nodeName(0))
			s.deleteUnseenAttachment()
			s.checkQuiet()
		}, "I4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			s := newSim(1, cfg)
			defer s.kill()
			// The controller has read every pod (I9 holds) unless the
			// plant starts another.
			for s.recovery != nil {
				s.readPods()
			}
			tc.plant(s)
			var got []string
			for _, v := range s.violations {
				got = append(got, strings.SplitN(v, ":", 2)[0])
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("violations %q in a right world", s.violations)
			case tc.want != "" && !strings.Contains(strings.Join(got, " "), tc.want):
				t.Errorf("violations %q, want one of %s", s.violations, tc.want)
			}
		})
	}
}
