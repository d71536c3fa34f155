package cache

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The node status record itself is pkg/nodestatus's (its tests drive the
// report protocol); these test what the actual state tells it.

func av(name volume.Name, devicePath string) v1.AttachedVolume {
	return v1.AttachedVolume{Name: v1.UniqueVolumeName(name), DevicePath: devicePath}
}

func TestReportWant(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	kA, kB, kC, kD, kE := k(volA, "n1"), k(volB, "n1"), k(volC, "n1"), k(volD, "n1"), k("kubernetes.io/csi/d.example.com^e", "n1")
	a := NewActualState()
	a.Update(kC, true, set(Attachment{State: Attached, DevicePath: "/dev/c"}))
	a.Update(kA, true, set(Attachment{State: Attached}))
	a.Update(kB, true, set(Attachment{State: Attached, Withdrawn: true}))
	a.Update(kD, true, set(Attachment{State: Uncertain}))
	a.Update(kE, true, set(Attachment{State: Attached, Withdrawn: true, DetachStarted: t0}))
	a.Update(k(volA, "n2"), true, set(Attachment{State: Attached}))
	if got, want := a.ReportWant("n1"), []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}; !reflect.DeepEqual(got, want) {
		t.Errorf("ReportWant = %v, want %v: attached volumes not withdrawn, sorted", got, want)
	}
	if got := a.ReportWant("unknown"); got != nil {
		t.Errorf("ReportWant of an unknown node = %v, want nothing", got)
	}
	if got := a.WithdrawnOn("n1"); !sameKeys(got, []Key{kB, kE}) {
		t.Errorf("WithdrawnOn = %v, want %v", got, []Key{kB, kE})
	}
	// During a handoff a volume withdrawn for a detach that has not
	// started is listed again.
	a.HandOver()
	if got, want := a.ReportWant("n1"), []v1.AttachedVolume{av(volA, ""), av(volB, ""), av(volC, "/dev/c")}; !reflect.DeepEqual(got, want) {
		t.Errorf("ReportWant during a handoff = %v, want %v", got, want)
	}
	var seen []string
	a.EachNode(func(r NodeReport) {
		seen = append(seen, r.Name)
		if r.Name == "n1" && (len(r.Attachments) != 5 || len(r.Want) != 3) {
			t.Errorf("EachNode n1: %d attachments, want %v; want 5 and 3 wanted", len(r.Attachments), r.Want)
		}
	})
	if len(seen) != 2 {
		t.Errorf("EachNode called for %v, want n1 and n2", seen)
	}
}

func TestStartDetach(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	kA, kB, kC := k(volA, "n1"), k(volB, "n1"), k(volC, "n1")
	a := NewActualState()
	a.Update(kA, true, set(Attachment{State: Attached}))
	a.Update(kB, true, set(Attachment{State: Uncertain}))
	a.Update(kC, true, set(Attachment{State: Attached, DetachStarted: t0}))
	if a.StartDetach(k(volD, "n1"), t0) {
		t.Error("StartDetach of a volume not on record = true")
	}
	a.HandOver()
	if a.StartDetach(kA, t0) {
		t.Error("StartDetach of an attached volume during a handoff = true")
	}
	if at, _ := a.Get(kA); at.Withdrawn || !at.DetachStarted.IsZero() {
		t.Errorf("refused StartDetach changed %+v", at)
	}
	// An attach never confirmed, and a detach that began, still run.
	if !a.StartDetach(kB, t0) || !a.StartDetach(kC, t0.Add(time.Minute)) {
		t.Error("StartDetach during a handoff refused an uncertain volume or one whose detach began")
	}
	if at, _ := a.Get(kB); !at.Withdrawn || !at.DetachStarted.Equal(t0) {
		t.Errorf("started detach %+v: want withdrawn, started at t0", at)
	}
	if at, _ := a.Get(kC); !at.Withdrawn || !at.DetachStarted.Equal(t0) {
		t.Errorf("detach started again %+v: want its first start kept", at)
	}
}

func TestAttachPending(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		at   Attachment
		want bool
	}{
		{name: "uncertain", at: Attachment{State: Uncertain}, want: true},
		{name: "attached", at: Attachment{State: Attached}},
		{name: "failed", at: Attachment{State: Uncertain, AttachError: "refused"}},
		{name: "detach started", at: Attachment{State: Uncertain, DetachStarted: t0}},
	} {
		a := NewActualState()
		a.Update(k(volA, "n1"), true, set(tc.at))
		if got := a.AttachPending("n1"); got != tc.want {
			t.Errorf("%s: AttachPending = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// NodeGone is of the Node object a write began on: another one read since
// is not gone.
func TestNodeGoneOfTheObjectTheWriteBeganOn(t *testing.T) {
	a := NewActualState()
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true, UID: "first"}, time.Time{})
	a.Update(k(volA, "n1"), true, set(Attachment{State: Attached}))
	if keys := a.NodeGone("n1", "second", time.Time{}); keys != nil {
		t.Errorf("NodeGone of another object touched %v", keys)
	}
	if n, _ := a.Node("n1"); !n.Exists {
		t.Error("NodeGone of another object took the node away")
	}
	if keys := a.NodeGone("n1", "first", time.Time{}); !sameKeys(keys, []Key{k(volA, "n1")}) {
		t.Errorf("NodeGone touched %v, want its attachment", keys)
	}
	if n, _ := a.Node("n1"); n.Exists || !n.Managed {
		t.Errorf("gone node %+v: want gone, still managed", n)
	}
	if keys := a.NodeGone("n1", "first", time.Time{}); keys != nil {
		t.Errorf("second NodeGone touched %v", keys)
	}
	if keys := a.NodeGone("unknown", "", time.Time{}); keys != nil {
		t.Errorf("NodeGone of an unknown node touched %v", keys)
	}
}
