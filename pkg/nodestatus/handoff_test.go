package nodestatus

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

func TestHandOver(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	kA, kB, kC, kD := k(volA, "n1"), k(volB, "n1"), k(volC, "n2"), k(volD, "n2")
	a := cache.NewActualState()
	a.SetNode("n1", cache.NodeInfo{ResourceVersion: "1"}, time.Time{})
	a.SetNode("n2", cache.NodeInfo{ResourceVersion: "1"}, time.Time{})
	// A: attached and listed. B: withdrawn for a detach that has not
	// started. C: its detach started (VolumeAttachment deleted). D: an
	// attach under way.
	a.Update(kA, true, set(cache.Attachment{State: cache.Attached}))
	a.Update(kB, true, set(cache.Attachment{State: cache.Attached, Withdrawn: true, DetachWanted: t0}))
	a.Update(kC, true, set(cache.Attachment{State: cache.Attached, Withdrawn: true, DetachStarted: t0}))
	a.Update(kD, true, set(cache.Attachment{State: cache.Uncertain, AttachStarted: t0}))
	r := NewRecord(a)
	r.Recover("n1", []v1.AttachedVolume{av(volA, "")})

	if want, _ := r.Begin("n1"); !reflect.DeepEqual(want, []v1.AttachedVolume{av(volA, "")}) {
		t.Fatalf("before the handoff, n1's report = %v, want only %s", want, volA)
	}
	r.End("n1", []v1.AttachedVolume{av(volA, "")}, true)

	if got := r.HandOver(); !reflect.DeepEqual(got, []string{"n1"}) {
		t.Errorf("HandOver() nodes to write = %v, want [n1] (B is listed again; C's detach started)", got)
	}
	if !a.HandingOver() {
		t.Error("HandingOver() = false after HandOver")
	}
	if r.BeginDetach(kA, t0) {
		t.Error("BeginDetach during a handoff = true, want false: no detach starts")
	}
	if at, _ := a.Get(kA); at.Withdrawn || !at.DetachStarted.IsZero() {
		t.Errorf("refused BeginDetach changed %+v", at)
	}
	want, changed := r.Begin("n1")
	if !changed || !reflect.DeepEqual(want, []v1.AttachedVolume{av(volA, ""), av(volB, "")}) {
		t.Errorf("n1's report during the handoff = %v (changed %v), want %s and %s", want, changed, volA, volB)
	}
	if want, _ := r.Begin("n2"); len(want) != 0 {
		t.Errorf("n2's report during the handoff = %v, want nothing: C's detach started, D is not attached", want)
	}
	r.End("n2", nil, true)

	n, sample, toWrite := r.Unsettled(10)
	wantSample := []string{
		string(volA) + " on n1: node status write under way",
		string(volB) + " on n1: not yet listed in node status",
		string(volC) + " on n2: detach under way",
		string(volD) + " on n2: attach under way",
	}
	if n != 4 || !reflect.DeepEqual(sample, wantSample) {
		t.Errorf("Unsettled() = %d %q, want 4 %q", n, sample, wantSample)
	}
	if !reflect.DeepEqual(toWrite, []string{"n1"}) {
		t.Errorf("Unsettled() nodes to write = %v, want [n1] (its write is in flight)", toWrite)
	}
	if n, sample, _ := r.Unsettled(1); n != 4 || len(sample) != 1 {
		t.Errorf("Unsettled(1) = %d %q, want 4 and one entry", n, sample)
	}

	// The write lands; C's VolumeAttachment goes away; D is attached and
	// listed.
	r.End("n1", want, true)
	a.Delete(kC)
	a.Update(kD, false, func(at *cache.Attachment) { at.State = cache.Attached })
	if n, sample, _ := r.Unsettled(10); n != 1 || sample[0] != string(volD)+" on n2: not yet listed in node status" {
		t.Errorf("Unsettled() = %d %q, want D not yet listed", n, sample)
	}
	want, _ = r.Begin("n2")
	r.End("n2", want, true)
	if n, sample, toWrite := r.Unsettled(10); n != 0 || len(toWrite) != 0 {
		t.Errorf("Unsettled() after every write = %d %q %v, want 0 and no node to write", n, sample, toWrite)
	}
}

func TestUnsettledLeavesOutDeletedNodes(t *testing.T) {
	a := cache.NewActualState()
	r := NewRecord(a)
	a.Update(k(volA, "gone"), true, set(cache.Attachment{State: cache.Attached}))
	if n, sample, _ := r.Unsettled(10); n != 0 {
		t.Errorf("Unsettled() = %d %q, want 0: no status lists volumes of a node without a Node object", n, sample)
	}
	a.Update(k(volB, "gone"), true, set(cache.Attachment{State: cache.Detaching}))
	if n, _, _ := r.Unsettled(10); n != 1 {
		t.Errorf("Unsettled() = %d, want 1: a detach under way on a deleted node is still under way", n)
	}
}

// A write computed before the freeze, without a withdrawn volume, may land
// after it: the node's report is due again, although nothing differs at the
// moment of the freeze.
func TestHandOverDuringAWrite(t *testing.T) {
	kA := k(volA, "n1")
	a := cache.NewActualState()
	a.SetNode("n1", cache.NodeInfo{ResourceVersion: "1"}, time.Time{})
	a.Update(kA, true, set(cache.Attachment{State: cache.Attached}))
	r := NewRecord(a)
	r.Recover("n1", []v1.AttachedVolume{av(volA, "")})
	a.Update(kA, false, func(at *cache.Attachment) { at.Withdrawn = true })
	written, changed := r.Begin("n1")
	if !changed || len(written) != 0 {
		t.Fatalf("report after the withdrawal = %v (changed %v), want an empty write", written, changed)
	}
	if got := r.HandOver(); !reflect.DeepEqual(got, []string{"n1"}) {
		t.Errorf("HandOver() with a write in flight = %v, want [n1]", got)
	}
	r.End("n1", written, true)
	if _, _, toWrite := r.Unsettled(10); !reflect.DeepEqual(toWrite, []string{"n1"}) {
		t.Errorf("after the write landed, nodes to write = %v, want [n1]", toWrite)
	}
	if want, changed := r.Begin("n1"); !changed || !reflect.DeepEqual(want, []v1.AttachedVolume{av(volA, "")}) {
		t.Errorf("next report = %v (changed %v), want %s listed again", want, changed, volA)
	}
}
