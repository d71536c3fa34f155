package bench

import "testing"

func TestExpectationNames(t *testing.T) {
	w := NewWorkload("t", "d.example.com", 2, 2)
	e := w.Expect(w.All())
	if e.Volumes() != 4 {
		t.Fatalf("%d volumes expected, want 4", e.Volumes())
	}
	// The contract's name: csi- + sha256(handle + driver + node), here of
	// "t-vol-00000" + "d.example.com" + "t-node-0000" (sha256sum).
	if name := "csi-af989db65d652392d59ae2ffa9371602b6a4a04fd9a64ce46a9e4eb66483c5e8"; !e.vas[name] {
		t.Errorf("VolumeAttachment %s not expected: %v", name, e.vas)
	}
	if !e.nodes["t-node-0000"]["kubernetes.io/csi/d.example.com^t-vol-00000"] {
		t.Errorf("node t-node-0000 does not expect t-vol-00000: %v", e.nodes)
	}
	if !e.nodes["t-node-0001"]["kubernetes.io/csi/d.example.com^t-vol-00003"] {
		t.Errorf("node t-node-0001 does not expect t-vol-00003: %v", e.nodes)
	}
	w.Move(w.ChurnSet(0), 1)
	e = w.Expect(w.All())
	if !e.nodes["t-node-0001"]["kubernetes.io/csi/d.example.com^t-vol-00000"] ||
		!e.nodes["t-node-0000"]["kubernetes.io/csi/d.example.com^t-vol-00002"] {
		t.Errorf("after one churn round: %v", e.nodes)
	}
}
