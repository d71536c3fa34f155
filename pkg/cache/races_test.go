package cache

import (
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The cases below are the races the simulation (test/sim) found; each test
// fails without the rule it names.

func TestBeginDetachIsExclusiveWithTheReport(t *testing.T) {
	now := time.Now()
	kA := k(volA, "n1")
	for _, tc := range []struct {
		name     string
		reported bool
		writing  bool
		want     bool
	}{
		{name: "not listed, no write: starts", want: true},
		{name: "listed: waits for the write", reported: true},
		{name: "a write under way may list it: waits", writing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewActualState()
			a.SetNode("n1", NodeInfo{Managed: true, Ready: true})
			a.Update(kA, true, func(at *Attachment) { at.State = Uncertain; at.Reported = tc.reported })
			if tc.writing {
				a.Update(k(volB, "n1"), true, func(at *Attachment) { at.State = Attached })
				if _, changed := a.BeginReport("n1"); !changed {
					t.Fatal("no write begun")
				}
			}
			if got := a.BeginDetach(kA, now); got != tc.want {
				t.Fatalf("BeginDetach = %v, want %v", got, tc.want)
			}
			at, _ := a.Get(kA)
			if started := !at.DetachStarted.IsZero(); started != tc.want || at.Withdrawn != tc.want {
				t.Errorf("detach started %v, withdrawn %v; want both %v", started, at.Withdrawn, tc.want)
			}
			if !tc.want {
				return
			}
			// Attached after the detach started (an informer event): it
			// stays out of every later report.
			a.Update(kA, false, func(at *Attachment) { at.State = Attached })
			if list, _ := a.BeginReport("n1"); len(list) != 0 {
				t.Errorf("report %v lists a volume whose detach started", list)
			}
		})
	}
}

func TestSetNodeIgnoresOlderVersions(t *testing.T) {
	a := NewActualState()
	a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached })
	mounted := NodeInfo{Managed: true, Ready: true, ResourceVersion: "20", InUse: map[volume.Name]bool{volA: true}}
	a.SetNode("n1", mounted)
	older := NodeInfo{Managed: true, Ready: true, ResourceVersion: "19", InUse: map[volume.Name]bool{}}
	if keys, _ := a.SetNode("n1", older); keys != nil {
		t.Errorf("older version touched %v", keys)
	}
	if n, _ := a.Node("n1"); !n.InUse[volA] || n.ResourceVersion != "20" {
		t.Errorf("node %+v: an older version replaced what it had mounted", n)
	}
	if !a.Stale("n1", "19") || a.Stale("n1", "21") || a.Stale("n1", "") {
		t.Error("Stale does not tell an older version from a newer or unknown one")
	}
	newer := NodeInfo{Managed: true, Ready: true, ResourceVersion: "21", InUse: map[volume.Name]bool{}}
	if keys, _ := a.SetNode("n1", newer); len(keys) != 1 {
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
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, ResourceVersion: "20", UID: "uid-1"})
	a.DeleteNode("n1", true, time.Time{})
	answer := NodeInfo{Ready: true, ResourceVersion: "19", UID: "uid-1"}
	if keys, _ := a.SetNode("n1", answer); keys != nil {
		t.Errorf("version older than the deletion touched %v", keys)
	}
	if n, _ := a.Node("n1"); n.Exists || !n.Managed {
		t.Errorf("node %+v after an answer older than its deletion: want it gone, as last seen (managed)", n)
	}
	again := NodeInfo{Managed: true, Ready: true, ResourceVersion: "21", UID: "uid-2"}
	if keys, _ := a.SetNode("n1", again); len(keys) != 1 {
		t.Errorf("node created again touched %v, want its attachment", keys)
	}
	if n, _ := a.Node("n1"); !n.Exists || n.UID != "uid-2" {
		t.Errorf("node %+v after it was created again", n)
	}
}

func TestNodeGoneMountsUnknownUntilItsLastStateIsRead(t *testing.T) {
	a := NewActualState()
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{}})
	a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached })
	if _, changed := a.BeginReport("n1"); !changed {
		t.Fatal("no write of the attached volume")
	}
	if keys := a.NodeGone("n1", time.Time{}); len(keys) != 1 {
		t.Fatalf("NodeGone touched %v", keys)
	}
	n, _ := a.Node("n1")
	if n.Exists || !n.Mounted(volA) {
		t.Fatalf("gone node %+v: its volumes must count as mounted", n)
	}
	// The deleted object's last state, then the delete: what it had
	// mounted then.
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{volA: true}})
	a.DeleteNode("n1", true, time.Time{})
	if n, _ := a.Node("n1"); n.Exists || !n.Seen || !n.Mounted(volA) {
		t.Errorf("deleted node %+v: want its last in-use list", n)
	}
}

// A status write that finds the node gone, answered after the node was
// created again and read: the node read is the new one, which exists.
func TestNodeGoneAfterTheNodeCameBack(t *testing.T) {
	a := NewActualState()
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, ResourceVersion: "10", UID: "first", InUse: map[volume.Name]bool{}})
	a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached })
	if _, changed := a.BeginReport("n1"); !changed {
		t.Fatal("no write of the attached volume")
	}
	// An update of the object deleted, read late: it is the one gone.
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, ResourceVersion: "11", UID: "first", InUse: map[volume.Name]bool{}})
	if keys := a.NodeGone("n1", time.Time{}); len(keys) != 1 {
		t.Errorf("NodeGone touched %v after a late update of the node deleted, want its attachment", keys)
	}
	// Created again; the new object is read before the write's answer.
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, ResourceVersion: "30", UID: "second", InUse: map[volume.Name]bool{}})
	if _, changed := a.BeginReport("n1"); !changed {
		t.Fatal("no write of the attached volume")
	}
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, ResourceVersion: "40", UID: "third", InUse: map[volume.Name]bool{}})
	if keys := a.NodeGone("n1", time.Time{}); len(keys) != 0 {
		t.Errorf("NodeGone touched %v for a node read since the write began", keys)
	}
	if n, _ := a.Node("n1"); !n.Exists || !n.Ready {
		t.Errorf("node created again %+v: want it to exist, Ready", n)
	}
	a.EndReport("n1", nil, true)
	if want, changed := a.BeginReport("n1"); !changed || len(want) != 1 {
		t.Errorf("BeginReport = %v, %v; want a write listing the attached volume on the node created again", want, changed)
	}
}

func TestDetachedWhileListedStaysListedUntilWritten(t *testing.T) {
	a := NewActualState()
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true})
	kA := k(volA, "n1")
	a.Update(kA, true, func(at *Attachment) { at.State = Attached; at.Reported = true })
	a.Delete(kA) // its VolumeAttachment went away while node status listed it
	// Recorded again (attached anew) before any write: it may be listed.
	a.Update(kA, true, func(at *Attachment) { at.State = Uncertain })
	if !a.ReportPending(kA) || a.BeginDetach(kA, time.Now()) {
		t.Fatal("a volume node status may still list is not reported")
	}
	list, changed := a.BeginReport("n1")
	if !changed || len(list) != 0 {
		t.Fatalf("BeginReport = %v, %v; want a write listing nothing", list, changed)
	}
	a.EndReport("n1", list, true)
	if a.ReportPending(kA) || !a.BeginDetach(kA, time.Now()) {
		t.Error("after the write, the detach may start")
	}
	// Erased and never recorded again: the next write still takes it out.
	b := NewActualState()
	b.SetNode("n1", NodeInfo{Managed: true, Ready: true})
	b.Update(kA, true, func(at *Attachment) { at.State = Attached; at.Reported = true })
	b.Delete(kA)
	if _, changed := b.BeginReport("n1"); !changed {
		t.Error("node status still lists a detached volume and no write is due")
	}
}

// A write that lists a volume is in flight when the volume's record goes
// (someone deleted its VolumeAttachment): the write's success must not
// clear what it just listed. Recorded again, the volume counts as listed,
// and a detach waits for a write that takes it out.
func TestRecordGoneDuringAWriteThatListsItStaysListed(t *testing.T) {
	for _, ok := range []bool{true, false} {
		a := NewActualState()
		a.SetNode("n1", NodeInfo{Managed: true, Ready: true})
		kA := k(volA, "n1")
		a.Update(kA, true, func(at *Attachment) { at.State = Attached })
		written, changed := a.BeginReport("n1")
		if !changed || len(written) != 1 {
			t.Fatalf("BeginReport = %v, %v; want a write listing %s", written, changed, volA)
		}
		a.Delete(kA)
		a.EndReport("n1", written, ok)
		a.Update(kA, true, func(at *Attachment) { at.State = Uncertain })
		if !a.ReportPending(kA) || a.BeginDetach(kA, time.Now()) {
			t.Errorf("write ok=%v: a volume the write listed is taken as not listed", ok)
		}
		list, changed := a.BeginReport("n1")
		if !changed || len(list) != 0 {
			t.Errorf("write ok=%v: BeginReport = %v, %v; want a write taking it out", ok, list, changed)
		}
		a.EndReport("n1", list, true)
		if a.ReportPending(kA) || !a.BeginDetach(kA, time.Now()) {
			t.Errorf("write ok=%v: after the write that took it out, the detach may start", ok)
		}
	}
}

// A node whose deletion came from a relist (a tombstone, its last state
// unknown) may have anything mounted; one deleted with its final state
// keeps that state.
func TestDeletedNodeWithoutItsFinalStateMayHaveAnythingMounted(t *testing.T) {
	for _, final := range []bool{true, false} {
		a := NewActualState()
		a.SetNode("n1", NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{}})
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
