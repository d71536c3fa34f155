package sim

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The kubelet model's order of events, step by step: a pod's volume is in
// use before it is attached, but only from the status loop's next tick;
// it is mounted once listed in use and attached; a pod removed at once
// keeps it in use until it is unmounted and the tick after that.
func TestSimulationKubeletOrder(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Trace = true
	s := newSim(1, cfg)
	defer s.kill()
	node := nodeName(0)
	v := s.volumeByPV("rwo-0")
	name := v1.UniqueVolumeName(kubeletName(v))
	inUse := func() []v1.UniqueVolumeName { return s.w.node(node).Status.VolumesInUse }
	toTick := func() {
		s.clock.SetTime(s.nextStatusTick(node))
		if !s.statusDue(node) {
			t.Fatal("no status update due at the loop's tick")
		}
	}
	// doAll runs every mount and unmount the kubelet has to make (an
	// unmount may fail: tried again).
	doAll := func() {
		for range 100 {
			todo := s.kubeletMounts(s.w.node(node))
			if len(todo) == 0 {
				return
			}
			todo[0]()
		}
		t.Fatal("the kubelet never finishes")
	}

	s.createPod("rwo-0", node)
	if s.kubeletChange(s.w.node(node)) == nil {
		t.Fatal("no volumesInUse change for a pod's volume, not attached")
	}
	if s.statusDue(node) {
		toTick()
		s.kubelet(node)
	}
	s.createPod("rwo-0", node) // a second pod: a change is due again
	if s.statusDue(node) {
		t.Fatal("volumesInUse would be written again before the next tick")
	}
	toTick()
	s.kubelet(node)
	if !slices.Contains(inUse(), name) {
		t.Fatalf("volumesInUse %v: want %s in use before it is attached", inUse(), name)
	}
	doAll()
	if len(s.mounts[node]) != 0 {
		t.Fatal("mounted before volumesAttached listed it")
	}

	n := s.w.node(node).DeepCopy()
	n.Status.VolumesAttached = []v1.AttachedVolume{{Name: name}}
	s.w.update(rNodes, n)
	doAll()
	if len(s.mounts[node][string(name)]) != 2 {
		t.Fatalf("mounts %v: want the volume mounted for both pods", s.mounts[node])
	}

	for _, o := range s.w.list(rPods) {
		s.w.remove(rPods, keyOf(o))
	}
	doAll()
	if len(s.mounts[node]) != 0 {
		t.Fatalf("mounts %v: want none once the pods are gone", s.mounts[node])
	}
	if !slices.Contains(inUse(), name) {
		t.Fatalf("volumesInUse %v: want the volume in use until the next tick", inUse())
	}
	toTick()
	s.kubelet(node)
	if len(inUse()) != 0 {
		t.Fatalf("volumesInUse %v: want nothing once unmounted and reported", inUse())
	}
}
