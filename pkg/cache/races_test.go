package cache

import (
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The cases below are the races the simulation (test/sim) found; each test
// fails without the rule it names.

func TestSetNodeIgnoresOlderVersions(t *testing.T) {
	a := NewActualState()
	a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached })
	mounted := NodeInfo{Managed: true, Ready: true, ResourceVersion: "20", InUse: map[volume.Name]bool{volA: true}}
	a.SetNode("n1", mounted, time.Time{})
	older := NodeInfo{Managed: true, Ready: true, ResourceVersion: "19", InUse: map[volume.Name]bool{}}
	if keys, _ := a.SetNode("n1", older, time.Time{}); keys != nil {
		t.Errorf("older version touched %v", keys)
	}
	if n, _ := a.Node("n1"); !n.InUse[volA] || n.ResourceVersion != "20" {
		t.Errorf("node %+v: an older version replaced what it had mounted", n)
	}
	if !a.Stale("n1", "", "19") || a.Stale("n1", "", "21") || a.Stale("n1", "", "") {
		t.Error("Stale does not tell an older version from a newer or unknown one")
	}
	newer := NodeInfo{Managed: true, Ready: true, ResourceVersion: "21", InUse: map[volume.Name]bool{}}
	if keys, _ := a.SetNode("n1", newer, time.Time{}); len(keys) != 1 {
		t.Errorf("newer version touched %v, want the unmounted key", keys)
	}
}

// The answer of a status write that landed before the node was deleted,
// coming after its deletion was read, does not bring the node back: its
// volumes would be taken for those of an existing node (unmanaged, as the
// answer said, they would never be detached). A node created again, newer
// than the deletion, is.
func TestSetNodeIgnoresVersionsOlderThanTheDeletion(t *testing.T) {
	a := NewActualState()
	a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached })
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, ResourceVersion: "20", UID: "uid-1"}, time.Time{})
	a.DeleteNode("n1", true, time.Time{})
	answer := NodeInfo{Ready: true, ResourceVersion: "19", UID: "uid-1"}
	if keys, _ := a.SetNode("n1", answer, time.Time{}); keys != nil {
		t.Errorf("version older than the deletion touched %v", keys)
	}
	if n, _ := a.Node("n1"); n.Exists || !n.Managed {
		t.Errorf("node %+v after an answer older than its deletion: want it gone, as last seen (managed)", n)
	}
	again := NodeInfo{Managed: true, Ready: true, ResourceVersion: "21", UID: "uid-2"}
	if keys, _ := a.SetNode("n1", again, time.Time{}); len(keys) != 1 {
		t.Errorf("node created again touched %v, want its attachment", keys)
	}
	if n, _ := a.Node("n1"); !n.Exists || n.UID != "uid-2" {
		t.Errorf("node %+v after it was created again", n)
	}
}

// A node whose deletion came from a relist (a tombstone, its last state
// unknown) may have anything mounted; one deleted with its final state
// keeps that state.
func TestDeletedNodeWithoutItsFinalStateMayHaveAnythingMounted(t *testing.T) {
	for _, final := range []bool{true, false} {
		a := NewActualState()
		a.SetNode("n1", NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{}}, time.Time{})
		a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached })
		if keys := a.DeleteNode("n1", final, time.Time{}); len(keys) != 1 {
			t.Errorf("final=%v: DeleteNode touched %v, want the attachment", final, keys)
		}
		n, _ := a.Node("n1")
		if n.Exists || n.Mounted(volA) == final {
			t.Errorf("final=%v: node %+v, mounted %v; want gone, mounted %v", final, n, n.Mounted(volA), !final)
		}
	}
}

// One disk spelled two ways (two in-tree names, one CSI name) is found
// attached elsewhere under any of its names.
func TestAttachedElsewhereFindsOtherSpellings(t *testing.T) {
	csi := volume.CSIName("ebs.csi.aws.com", "vol-1")
	one := &volume.Spec{Name: "kubernetes.io/aws-ebs/aws://us-east-1a/vol-1", Aliases: []volume.Name{csi},
		Driver: "ebs.csi.aws.com", VolumeHandle: "vol-1", SingleNode: true}
	other := &volume.Spec{Name: "kubernetes.io/aws-ebs/vol-1", Aliases: []volume.Name{csi},
		Driver: "ebs.csi.aws.com", VolumeHandle: "vol-1", SingleNode: true}
	a := NewActualState()
	kOne := Key{Volume: one.Name, Node: "n1"}
	a.Update(kOne, true, func(at *Attachment) { at.Spec = one })
	if got := a.AttachedElsewhere(append(other.AllNames(), other.DiskName()), "n2"); len(got) != 1 || got[0] != kOne {
		t.Errorf("AttachedElsewhere = %v, want %v", got, kOne)
	}
	a.Delete(kOne)
	if got := a.AttachedElsewhere(append(other.AllNames(), other.DiskName()), "n2"); len(got) != 0 {
		t.Errorf("AttachedElsewhere = %v after the detach, want nothing", got)
	}
}
