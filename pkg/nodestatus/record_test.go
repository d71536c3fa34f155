package nodestatus

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func k(v volume.Name, node string) cache.Key { return cache.Key{Volume: v, Node: node} }

func set(a cache.Attachment) func(*cache.Attachment) {
	return func(at *cache.Attachment) { *at = a }
}

func sameKeys(got, want []cache.Key) bool {
	if len(got) == 0 || len(want) == 0 {
		return len(got) == len(want)
	}
	return reflect.DeepEqual(sortKeys(got), sortKeys(want))
}

// newRecord returns an actual state holding attachments, with node n1
// known, and a record in which node n1's status lists listed (as read at
// start).
func newRecord(attachments []cache.Attachment, listed []v1.AttachedVolume) (*cache.ActualState, *Record) {
	a := cache.NewActualState()
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
	for _, at := range attachments {
		a.Update(at.Key, true, set(at))
	}
	r := NewRecord(a)
	r.Recover("n1", listed)
	return a, r
}

// TestRecordReport runs the node status report protocol: Begin, the write,
// End; Observe when the Node object says otherwise.
func TestRecordReport(t *testing.T) {
	// Each step is one call of the protocol.
	type step struct {
		begin   bool // Begin; else End of the last Begin's list (or of written)
		end     bool
		ok      bool
		written []v1.AttachedVolume // for end: when nil, the last Begin's list
		observe []v1.AttachedVolume // Observe(seen)
		update  *cache.Key          // mark this attachment Withdrawn
		attach  *cache.Key          // create this attachment, Attached

		wantList     []v1.AttachedVolume
		wantChanged  bool
		wantKeys     []cache.Key // for end
		wantInFlight bool
		wantListed   []v1.AttachedVolume
	}
	ghost := volume.Name("kubernetes.io/csi/d.example.com^ghost")
	kA, kB, kC := k(volA, "n1"), k(volB, "n1"), k(volC, "n1")
	tests := []struct {
		name        string
		attachments []cache.Attachment
		// listed: what node status lists at start (Recover).
		listed []v1.AttachedVolume
		steps  []step
	}{
		{
			name: "only attached and not withdrawn volumes are reported, sorted",
			attachments: []cache.Attachment{
				{Key: kC, State: cache.Attached, DevicePath: "/dev/c"},
				{Key: kA, State: cache.Attached},
				{Key: kB, State: cache.Attached, Withdrawn: true},
				{Key: k(volD, "n1"), State: cache.Uncertain},
				{Key: k("kubernetes.io/csi/d.example.com^e", "n1"), State: cache.Detaching},
				{Key: k(volA, "n2"), State: cache.Attached},
			},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []cache.Key{kA, kB, kC}, wantListed: []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}, wantChanged: false, wantInFlight: false},
			},
		},
		{
			name:  "node with nothing attached: nothing to report",
			steps: []step{{begin: true, wantList: nil, wantChanged: false}},
		},
		{
			name:        "withdrawal confirmed by a successful write",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, ""), av(volB, "")},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volB, "")}, wantChanged: false},
				{update: &kB, wantListed: []v1.AttachedVolume{av(volA, ""), av(volB, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []cache.Key{kB}, wantListed: []v1.AttachedVolume{av(volA, "")}},
			},
		},
		{
			name:        "failed write: written volumes count as listed, listed ones stay",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Attached, Withdrawn: true}, {Key: kC, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, ""), av(volB, "")},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: false, wantKeys: []cache.Key{kB, kC}, wantListed: []v1.AttachedVolume{av(volA, ""), av(volB, ""), av(volC, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []cache.Key{kB}, wantListed: []v1.AttachedVolume{av(volA, ""), av(volC, "")}},
			},
		},
		{
			name:        "failed write of an added volume is written again",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: false, wantKeys: []cache.Key{kA}, wantListed: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: nil, wantListed: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: false},
			},
		},
		{
			name:        "a volume attached during the write is reported by the next one",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{attach: &kB, wantInFlight: true},
				{end: true, ok: true, wantKeys: []cache.Key{kA}, wantListed: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volB, "")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "node missing: empty report confirmed",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached, Withdrawn: true}, {Key: kB, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volB, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, written: []v1.AttachedVolume{}, wantKeys: []cache.Key{kA}, wantListed: nil},
			},
		},
		{
			// A volume node status lists with no attachment on record
			// stays listed until a write that lands without it.
			name:        "phantom volume in node status: next report changed until written",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, ""), av(ghost, "")}, wantListed: []v1.AttachedVolume{av(volA, ""), av(ghost, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: nil, wantListed: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: false},
			},
		},
		{
			name:        "phantom still there after a failed write",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, ""), av(ghost, "")}, wantListed: []v1.AttachedVolume{av(volA, ""), av(ghost, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: false, wantKeys: nil, wantListed: []v1.AttachedVolume{av(volA, ""), av(ghost, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "listed volume with another device path in node status",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached, DevicePath: "/dev/sdb"}},
			listed:      []v1.AttachedVolume{av(volA, "/dev/sdb")},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, "/dev/sdc")}, wantListed: []v1.AttachedVolume{av(volA, "/dev/sdb")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "/dev/sdb")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "listed volume listed twice in node status",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, ""), av(volA, "")}, wantListed: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "node status as listed: no write",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached, DevicePath: "/dev/sdb"}, {Key: kB, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "/dev/sdb"), av(volB, "")},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volB, ""), av(volA, "/dev/sdb")}, wantListed: []v1.AttachedVolume{av(volA, "/dev/sdb"), av(volB, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "/dev/sdb"), av(volB, "")}, wantChanged: false},
			},
		},
		{
			name:        "listed volume missing from node status",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			steps: []step{
				// The object may predate a write that listed A: A stays
				// listed, B (listed) counts as listed until written.
				{observe: []v1.AttachedVolume{av(volB, "")}, wantListed: []v1.AttachedVolume{av(volA, ""), av(volB, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []cache.Key{kB}, wantListed: []v1.AttachedVolume{av(volA, "")}},
			},
		},
		{
			// An informer event older than the controller's last write
			// must not make a withdrawn volume look unlisted: its detach
			// would start while the node status may still list it.
			name:        "stale observation never clears listed",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached, Withdrawn: true}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			steps: []step{
				{observe: []v1.AttachedVolume{}, wantListed: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: nil, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []cache.Key{kA}, wantListed: nil},
			},
		},
		{
			// Someone may have written after the write landed: the node
			// status is written again.
			name:        "observation during a write is taken when it ends",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{observe: []v1.AttachedVolume{av(ghost, "")}, wantInFlight: true, wantListed: nil},
				{end: true, ok: true, wantKeys: []cache.Key{kA}, wantListed: []v1.AttachedVolume{av(volA, ""), av(ghost, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, r := newRecord(tt.attachments, tt.listed)
			var last []v1.AttachedVolume
			for i, s := range tt.steps {
				switch {
				case s.begin:
					list, changed := r.Begin("n1")
					if !reflect.DeepEqual(list, s.wantList) || changed != s.wantChanged {
						t.Errorf("step %d: Begin = %v, %v; want %v, %v", i, list, changed, s.wantList, s.wantChanged)
					}
					last = list
				case s.end:
					written := last
					if s.written != nil {
						written = s.written
					}
					keys := r.End("n1", written, s.ok)
					if !sameKeys(keys, s.wantKeys) {
						t.Errorf("step %d: End keys = %v, want %v", i, keys, s.wantKeys)
					}
				case s.observe != nil:
					r.Observe("n1", s.observe, "")
				case s.update != nil:
					a.Update(*s.update, false, func(at *cache.Attachment) { at.Withdrawn = true })
				case s.attach != nil:
					a.Update(*s.attach, true, func(at *cache.Attachment) { at.State = cache.Attached })
				}
				if got := r.InFlight("n1"); got != s.wantInFlight {
					t.Errorf("step %d: InFlight = %v, want %v", i, got, s.wantInFlight)
				}
				if s.end || s.observe != nil || s.update != nil {
					if got := r.Listed("n1"); !reflect.DeepEqual(got, s.wantListed) {
						t.Errorf("step %d: Listed = %v, want %v", i, got, s.wantListed)
					}
				}
				for _, key := range []cache.Key{kA, kB, kC, k(ghost, "n1")} {
					listed := false
					for _, l := range r.Listed("n1") {
						listed = listed || volume.Name(l.Name) == key.Volume
					}
					if got := r.IsListed(key); got != listed {
						t.Errorf("step %d: IsListed(%s) = %v, Listed says %v", i, key, got, listed)
					}
				}
			}
		})
	}
}

// The cases below are the races the simulation (test/sim) found; each test
// fails without the rule it names.

func TestBeginDetachIsExclusiveWithTheReport(t *testing.T) {
	now := time.Now()
	kA := k(volA, "n1")
	for _, tc := range []struct {
		name   string
		listed bool
		write  bool
		want   bool
	}{
		{name: "not listed, no write: starts", want: true},
		{name: "listed: waits for the write", listed: true},
		{name: "a write under way may list it: waits", write: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var listed []v1.AttachedVolume
			if tc.listed {
				listed = []v1.AttachedVolume{av(volA, "")}
			}
			a, r := newRecord([]cache.Attachment{{Key: kA, State: cache.Uncertain}}, listed)
			if tc.write {
				a.Update(k(volB, "n1"), true, func(at *cache.Attachment) { at.State = cache.Attached })
				if _, changed := r.Begin("n1"); !changed {
					t.Fatal("no write begun")
				}
			}
			if got := r.Pending(kA); got == tc.want {
				t.Errorf("Pending = %v, want %v", got, !tc.want)
			}
			if got := r.BeginDetach(kA, now); got != tc.want {
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
			a.Update(kA, false, func(at *cache.Attachment) { at.State = cache.Attached })
			if list, _ := r.Begin("n1"); len(list) != 0 {
				t.Errorf("report %v lists a volume whose detach started", list)
			}
		})
	}
}

func TestBeginDetachOfAVolumeNotOnRecord(t *testing.T) {
	_, r := newRecord(nil, nil)
	if r.BeginDetach(k(volA, "n1"), time.Now()) {
		t.Error("BeginDetach of a volume not on record = true, want false")
	}
}

func TestNodeGoneMountsUnknownUntilItsLastStateIsRead(t *testing.T) {
	a := cache.NewActualState()
	r := NewRecord(a)
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{}}, time.Time{})
	a.Update(k(volA, "n1"), true, func(at *cache.Attachment) { at.State = cache.Attached })
	if _, changed := r.Begin("n1"); !changed {
		t.Fatal("no write of the attached volume")
	}
	if keys := r.NodeGone("n1", time.Time{}); len(keys) != 1 {
		t.Fatalf("NodeGone touched %v", keys)
	}
	n, _ := a.Node("n1")
	if n.Exists || !n.Mounted(volA) {
		t.Fatalf("gone node %+v: its volumes must count as mounted", n)
	}
	// The deleted object's last state, then the delete: what it had
	// mounted then.
	a.SetFinal("n1", cache.NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{volA: true}})
	a.DeleteNode("n1", true, time.Time{})
	if n, _ := a.Node("n1"); n.Exists || !n.Seen || !n.Mounted(volA) {
		t.Errorf("deleted node %+v: want its last in-use list", n)
	}
}

// A status write that finds the node gone, answered after the node was
// created again and read: the node read is the new one, which exists.
func TestNodeGoneAfterTheNodeCameBack(t *testing.T) {
	a := cache.NewActualState()
	r := NewRecord(a)
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, ResourceVersion: "10", UID: "first", InUse: map[volume.Name]bool{}}, time.Time{})
	a.Update(k(volA, "n1"), true, func(at *cache.Attachment) { at.State = cache.Attached })
	if _, changed := r.Begin("n1"); !changed {
		t.Fatal("no write of the attached volume")
	}
	// An update of the object deleted, read late: it is the one gone.
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, ResourceVersion: "11", UID: "first", InUse: map[volume.Name]bool{}}, time.Time{})
	if keys := r.NodeGone("n1", time.Time{}); len(keys) != 1 {
		t.Errorf("NodeGone touched %v after a late update of the node deleted, want its attachment", keys)
	}
	// Created again; the new object is read before the write's answer.
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, ResourceVersion: "30", UID: "second", InUse: map[volume.Name]bool{}}, time.Time{})
	if _, changed := r.Begin("n1"); !changed {
		t.Fatal("no write of the attached volume")
	}
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, ResourceVersion: "40", UID: "third", InUse: map[volume.Name]bool{}}, time.Time{})
	if keys := r.NodeGone("n1", time.Time{}); len(keys) != 0 {
		t.Errorf("NodeGone touched %v for a node read since the write began", keys)
	}
	if n, _ := a.Node("n1"); !n.Exists || !n.Ready {
		t.Errorf("node created again %+v: want it to exist, Ready", n)
	}
	r.End("n1", nil, true)
	if want, changed := r.Begin("n1"); !changed || len(want) != 1 {
		t.Errorf("Begin = %v, %v; want a write listing the attached volume on the node created again", want, changed)
	}
}

// A write's answer from a Node object the controller has seen replaced
// since confirms nothing (EndOn): the write counts as failed.
func TestEndOnAReplacedNode(t *testing.T) {
	a, r := newRecord([]cache.Attachment{{Key: k(volA, "n1"), State: cache.Attached}}, nil)
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, ResourceVersion: "10", UID: "old"}, time.Time{})
	written, changed := r.Begin("n1")
	if !changed {
		t.Fatal("no write of the attached volume")
	}
	a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, ResourceVersion: "20", UID: "new"}, time.Time{})
	if _, landed := r.EndOn("n1", "old", "", written); landed {
		t.Error("EndOn of the replaced object: landed, want not")
	}
	if !r.IsListed(k(volA, "n1")) {
		t.Error("a volume the write carried is not listed after it counted as failed")
	}
	written, changed = r.Begin("n1")
	if !changed {
		t.Fatal("no write again after a write that counted as failed")
	}
	if _, landed := r.EndOn("n1", "new", "", written); !landed {
		t.Error("EndOn of the object known: not landed")
	}
	if _, changed := r.Begin("n1"); changed {
		t.Error("write due after the write landed")
	}
}

func TestDetachedWhileListedStaysListedUntilWritten(t *testing.T) {
	kA := k(volA, "n1")
	a, r := newRecord([]cache.Attachment{{Key: kA, State: cache.Attached}}, []v1.AttachedVolume{av(volA, "")})
	a.Delete(kA) // its VolumeAttachment went away while node status listed it
	// Recorded again (attached anew) before any write: it may be listed.
	a.Update(kA, true, func(at *cache.Attachment) { at.State = cache.Uncertain })
	if !r.Pending(kA) || r.BeginDetach(kA, time.Now()) {
		t.Fatal("a volume node status may still list is not listed")
	}
	list, changed := r.Begin("n1")
	if !changed || len(list) != 0 {
		t.Fatalf("Begin = %v, %v; want a write listing nothing", list, changed)
	}
	r.End("n1", list, true)
	if r.Pending(kA) || !r.BeginDetach(kA, time.Now()) {
		t.Error("after the write, the detach may start")
	}
	// Erased and never recorded again: the next write still takes it out.
	b, rb := newRecord([]cache.Attachment{{Key: kA, State: cache.Attached}}, []v1.AttachedVolume{av(volA, "")})
	b.Delete(kA)
	if _, changed := rb.Begin("n1"); !changed {
		t.Error("node status still lists a detached volume and no write is due")
	}
}

// A write that lists a volume is in flight when the volume's record goes
// (someone deleted its VolumeAttachment): the write's success must not
// clear what it just listed. Recorded again, the volume counts as listed,
// and a detach waits for a write that takes it out.
func TestRecordGoneDuringAWriteThatListsItStaysListed(t *testing.T) {
	for _, ok := range []bool{true, false} {
		kA := k(volA, "n1")
		a, r := newRecord([]cache.Attachment{{Key: kA, State: cache.Attached}}, nil)
		written, changed := r.Begin("n1")
		if !changed || len(written) != 1 {
			t.Fatalf("Begin = %v, %v; want a write listing %s", written, changed, volA)
		}
		a.Delete(kA)
		r.End("n1", written, ok)
		a.Update(kA, true, func(at *cache.Attachment) { at.State = cache.Uncertain })
		if !r.Pending(kA) || r.BeginDetach(kA, time.Now()) {
			t.Errorf("write ok=%v: a volume the write listed is taken as not listed", ok)
		}
		list, changed := r.Begin("n1")
		if !changed || len(list) != 0 {
			t.Errorf("write ok=%v: Begin = %v, %v; want a write taking it out", ok, list, changed)
		}
		r.End("n1", list, true)
		if r.Pending(kA) || !r.BeginDetach(kA, time.Now()) {
			t.Errorf("write ok=%v: after the write that took it out, the detach may start", ok)
		}
	}
}

// Mirror makes the record say exactly what another controller wrote;
// Recover only adds.
func TestMirrorAndRecover(t *testing.T) {
	_, r := newRecord([]cache.Attachment{{Key: k(volA, "n1"), State: cache.Attached}}, []v1.AttachedVolume{av(volA, "/dev/a")})
	r.Recover("n1", []v1.AttachedVolume{av(volB, "")})
	if got, want := r.Listed("n1"), []v1.AttachedVolume{av(volA, "/dev/a"), av(volB, "")}; !reflect.DeepEqual(got, want) {
		t.Errorf("Listed after Recover = %v, want %v", got, want)
	}
	r.Mirror("n1", []v1.AttachedVolume{av(volC, "")})
	if got, want := r.Listed("n1"), []v1.AttachedVolume{av(volC, "")}; !reflect.DeepEqual(got, want) {
		t.Errorf("Listed after Mirror = %v, want %v", got, want)
	}
	r.Mirror("n1", nil)
	if got := r.Listed("n1"); got != nil {
		t.Errorf("Listed after Mirror of nothing = %v, want nothing", got)
	}
}

// Adds tells a write that lists an attached volume not listed yet.
func TestAdds(t *testing.T) {
	kA, kB := k(volA, "n1"), k(volB, "n1")
	a, r := newRecord([]cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}}, nil)
	if !r.Adds("n1") {
		t.Error("Adds = false with an attached volume not listed")
	}
	r.Recover("n1", []v1.AttachedVolume{av(volA, "")})
	if r.Adds("n1") {
		t.Error("Adds = true with every attached volume listed")
	}
	a.Update(kA, false, func(at *cache.Attachment) { at.Withdrawn = true })
	if r.Adds("n1") {
		t.Error("Adds = true for a withdrawal alone")
	}
	if r.Adds("unknown") {
		t.Error("Adds = true for a node with nothing")
	}
}

// Lists compares what a Node object holds, in any order, with the record.
func TestLists(t *testing.T) {
	_, r := newRecord(nil, []v1.AttachedVolume{av(volA, ""), av(volB, "/dev/b")})
	for _, tt := range []struct {
		seen []v1.AttachedVolume
		want bool
	}{
		{[]v1.AttachedVolume{av(volB, "/dev/b"), av(volA, "")}, true},
		{[]v1.AttachedVolume{av(volA, ""), av(volB, "/dev/c")}, false},
		{[]v1.AttachedVolume{av(volA, "")}, false},
		{[]v1.AttachedVolume{av(volA, ""), av(volA, "")}, false},
		{nil, false},
	} {
		if got := r.Lists("n1", tt.seen); got != tt.want {
			t.Errorf("Lists(%v) = %v, want %v", tt.seen, got, tt.want)
		}
	}
	if !r.Lists("n2", nil) {
		t.Error("a node with nothing on record: an empty list is what it lists")
	}
}

// Someone takes a volume out of node status right after the controller's
// write that lists it landed, before its answer is read: the informer's
// copy then lists what the record listed before the write, yet it is newer
// than the write. While a write is in flight Lists says no, so the object
// is observed; at the write's end, an observation older than the answer is
// dropped (no extra write), a newer one makes the status written again.
func TestStatusChangedDuringAWriteIsWrittenAgain(t *testing.T) {
	for _, tc := range []struct {
		name      string
		version   string // of the object observed during the write
		wantDirty bool
	}{
		{name: "an older object: what the write replaced", version: "5", wantDirty: false},
		{name: "a newer object: someone wrote after the write landed", version: "7", wantDirty: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := cache.NewActualState()
			r := NewRecord(a)
			a.SetNode("n1", cache.NodeInfo{Managed: true, Ready: true, UID: "u1", ResourceVersion: "4"}, time.Time{})
			a.Update(k(volA, "n1"), true, func(at *cache.Attachment) { at.State = cache.Attached })
			want, changed := r.Begin("n1")
			if !changed || len(want) != 1 {
				t.Fatalf("Begin = %v, %v; want a write of the attached volume", want, changed)
			}
			if r.Lists("n1", nil) {
				t.Error("Lists(nothing) while a write is in flight = true: the object may be newer than the write")
			}
			r.Observe("n1", nil, tc.version)
			r.EndOn("n1", "u1", "6", want)
			_, again := r.Begin("n1")
			if again != tc.wantDirty {
				t.Errorf("after the write's end, another write: %v, want %v", again, tc.wantDirty)
			}
		})
	}
}
