package cache

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	volA = volume.Name("kubernetes.io/csi/d.example.com^a")
	volB = volume.Name("kubernetes.io/csi/d.example.com^b")
	volC = volume.Name("kubernetes.io/csi/d.example.com^c")
	volD = volume.Name("kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0")
)

func set(a Attachment) func(*Attachment) {
	return func(at *Attachment) { *at = a }
}

func TestActualStateUpdate(t *testing.T) {
	key := k(volA, "n1")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type op struct {
		key     Key
		create  bool
		fn      func(*Attachment)
		delete  bool // Delete instead of Update
		changed bool
	}
	tests := []struct {
		name string
		ops  []op
		want map[Key]Attachment
		// wantByName maps VolumeAttachment names to the key they must find
		// (absent: ByAttachmentName must not find it).
		wantByName map[string]*Key
	}{
		{
			name: "update of a missing attachment without create does nothing",
			ops:  []op{{key: key, fn: set(Attachment{State: Attached}), changed: false}},
			want: map[Key]Attachment{},
		},
		{
			name: "create starts uncertain",
			ops:  []op{{key: key, create: true, fn: func(*Attachment) {}, changed: true}},
			want: map[Key]Attachment{key: {Key: key, State: Uncertain}},
		},
		{
			name: "create then the same values again: no change",
			ops: []op{
				{key: key, create: true, fn: func(a *Attachment) { a.State = Attached; a.DevicePath = "/dev/x" }, changed: true},
				{key: key, create: true, fn: func(a *Attachment) { a.State = Attached; a.DevicePath = "/dev/x" }, changed: false},
			},
			want: map[Key]Attachment{key: {Key: key, State: Attached, DevicePath: "/dev/x"}},
		},
		{
			name: "modify",
			ops: []op{
				{key: key, create: true, fn: func(a *Attachment) { a.State = Attached }, changed: true},
				{key: key, fn: func(a *Attachment) { a.DetachWanted = t0 }, changed: true},
				{key: key, fn: func(a *Attachment) { a.Withdrawn = true }, changed: true},
			},
			want: map[Key]Attachment{key: {Key: key, State: Attached, DetachWanted: t0, Withdrawn: true}},
		},
		{
			name: "fn can't move the attachment to another key",
			ops: []op{
				{key: key, create: true, fn: func(a *Attachment) { a.Key = k(volB, "n2") }, changed: true},
			},
			want: map[Key]Attachment{key: {Key: key, State: Uncertain}},
		},
		{
			name: "attachment name indexed, renamed, deleted",
			ops: []op{
				{key: key, create: true, fn: func(a *Attachment) { a.AttachmentName = "csi-1" }, changed: true},
				{key: k(volB, "n1"), create: true, fn: func(a *Attachment) { a.AttachmentName = "csi-b" }, changed: true},
				{key: key, fn: func(a *Attachment) { a.AttachmentName = "csi-2" }, changed: true},
				{key: k(volB, "n1"), delete: true, changed: true},
			},
			want:       map[Key]Attachment{key: {Key: key, State: Uncertain, AttachmentName: "csi-2"}},
			wantByName: map[string]*Key{"csi-1": nil, "csi-2": &key, "csi-b": nil},
		},
		{
			name: "delete",
			ops: []op{
				{key: key, create: true, fn: func(a *Attachment) { a.State = Attached; a.AttachmentName = "csi-1" }, changed: true},
				{key: k(volA, "n2"), create: true, fn: func(*Attachment) {}, changed: true},
				{key: key, delete: true, changed: true},
				{key: key, delete: true, changed: false},
			},
			want:       map[Key]Attachment{k(volA, "n2"): {Key: k(volA, "n2"), State: Uncertain}},
			wantByName: map[string]*Key{"csi-1": nil},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			for i, o := range tt.ops {
				var got bool
				if o.delete {
					got = a.Delete(o.key)
				} else {
					got = a.Update(o.key, o.create, o.fn)
				}
				if got != o.changed {
					t.Errorf("op %d on %s: changed = %v, want %v", i, o.key, got, o.changed)
				}
			}
			got := map[Key]Attachment{}
			for _, at := range a.Attachments() {
				if g, ok := a.Get(at.Key); !ok || g != at {
					t.Errorf("Get(%s) = %+v, %v; Attachments has %+v", at.Key, g, ok, at)
				}
				at.rev = 0 // the numbering of changes is DeleteUnchanged's
				got[at.Key] = at
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("attachments = %+v\nwant %+v", got, tt.want)
			}
			if keys := a.Keys(); len(keys) != len(tt.want) {
				t.Errorf("Keys() = %v, want %d keys", keys, len(tt.want))
			}
			for name, want := range tt.wantByName {
				gotKey, ok := a.ByAttachmentName(name)
				switch {
				case want == nil && ok:
					t.Errorf("ByAttachmentName(%s) = %s, want not found", name, gotKey)
				case want != nil && (!ok || gotKey != *want):
					t.Errorf("ByAttachmentName(%s) = %s, %v; want %s", name, gotKey, ok, *want)
				}
			}
		})
	}
}

func TestActualStateSetNode(t *testing.T) {
	ready := NodeInfo{Managed: true, Ready: true, InUse: map[volume.Name]bool{volA: true}}
	with := func(f func(*NodeInfo)) NodeInfo {
		n := ready
		n.InUse = map[volume.Name]bool{volA: true}
		f(&n)
		return n
	}
	tests := []struct {
		name string
		// before is the node's first SetNode; nil: the node is only known
		// through its attachments.
		before *NodeInfo
		after  NodeInfo
		want   []Key
	}{
		{name: "first sight of the node: all keys", before: nil, after: ready, want: []Key{k(volA, "n1"), k(volB, "n1")}},
		{name: "nothing changed", before: &ready, after: ready, want: nil},
		{name: "not ready any more: all keys", before: &ready, after: with(func(n *NodeInfo) { n.Ready = false }), want: []Key{k(volA, "n1"), k(volB, "n1")}},
		{name: "not managed any more: all keys", before: &ready, after: with(func(n *NodeInfo) { n.Managed = false }), want: []Key{k(volA, "n1"), k(volB, "n1")}},
		{name: "out of service: all keys", before: &ready, after: with(func(n *NodeInfo) { n.OutOfService = true }), want: []Key{k(volA, "n1"), k(volB, "n1")}},
		{name: "unmounted: that key", before: &ready, after: with(func(n *NodeInfo) { delete(n.InUse, volA) }), want: []Key{k(volA, "n1")}},
		{name: "mounted: that key", before: &ready, after: with(func(n *NodeInfo) { n.InUse[volB] = true }), want: []Key{k(volB, "n1")}},
		{name: "in use but not attached: no key", before: &ready, after: with(func(n *NodeInfo) { n.InUse[volC] = true }), want: nil},
		{name: "Exists given false is ignored", before: &ready, after: with(func(n *NodeInfo) { n.Exists = false }), want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			a.Update(k(volA, "n1"), true, set(Attachment{State: Attached}))
			a.Update(k(volB, "n1"), true, set(Attachment{State: Attached}))
			a.Update(k(volC, "n2"), true, set(Attachment{State: Attached}))
			if tt.before != nil {
				a.SetNode("n1", *tt.before)
			}
			got, _ := a.SetNode("n1", tt.after)
			if !sameKeys(got, tt.want) {
				t.Errorf("SetNode touched %v, want %v", got, tt.want)
			}
			info, ok := a.Node("n1")
			want := tt.after
			want.Exists, want.Seen = true, true
			if !ok || !reflect.DeepEqual(info, want) {
				t.Errorf("Node(n1) = %+v, %v; want %+v", info, ok, want)
			}
		})
	}
}

func TestActualStateDeleteNode(t *testing.T) {
	info := NodeInfo{Managed: true, Ready: true, OutOfService: true, InUse: map[volume.Name]bool{volA: true}}
	tests := []struct {
		name        string
		attachments []Key
		seen        bool // SetNode was called before
		deleteTwice bool
		want        []Key
		wantInfo    *NodeInfo // nil: the node is forgotten
	}{
		{
			name:        "attachments keep the node, with its in-use list",
			attachments: []Key{k(volA, "n1"), k(volB, "n1"), k(volA, "n2")},
			seen:        true,
			want:        []Key{k(volA, "n1"), k(volB, "n1")},
			wantInfo:    &NodeInfo{Exists: false, Managed: true, Ready: false, OutOfService: false, Seen: true, InUse: map[volume.Name]bool{volA: true}},
		},
		{
			name:        "second delete touches nothing",
			attachments: []Key{k(volA, "n1")},
			seen:        true,
			deleteTwice: true,
			want:        nil,
			wantInfo:    &NodeInfo{Exists: false, Managed: true, Ready: false, OutOfService: false, Seen: true, InUse: map[volume.Name]bool{volA: true}},
		},
		{name: "nothing attached: node forgotten", seen: true, want: []Key{}, wantInfo: nil},
		{name: "never seen", attachments: []Key{k(volA, "n1")}, want: nil, wantInfo: &NodeInfo{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			for _, key := range tt.attachments {
				a.Update(key, true, set(Attachment{State: Attached}))
			}
			if tt.seen {
				a.SetNode("n1", info)
			}
			got := a.DeleteNode("n1", true, time.Time{})
			if tt.deleteTwice {
				got = a.DeleteNode("n1", true, time.Time{})
			}
			if !sameKeys(got, tt.want) {
				t.Errorf("DeleteNode touched %v, want %v", got, tt.want)
			}
			gotInfo, ok := a.Node("n1")
			switch {
			case tt.wantInfo == nil && ok:
				t.Errorf("Node(n1) = %+v, want forgotten", gotInfo)
			case tt.wantInfo != nil && (!ok || !reflect.DeepEqual(gotInfo, *tt.wantInfo)):
				t.Errorf("Node(n1) = %+v, %v; want %+v", gotInfo, ok, *tt.wantInfo)
			}
		})
	}
}

func TestActualStateDeletedNodeForgottenWithItsLastAttachment(t *testing.T) {
	a := NewActualState()
	a.Update(k(volA, "n1"), true, set(Attachment{State: Attached}))
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true})
	a.DeleteNode("n1", true, time.Time{})
	if _, ok := a.Node("n1"); !ok {
		t.Fatalf("node with an attachment forgotten on delete")
	}
	a.Delete(k(volA, "n1"))
	if info, ok := a.Node("n1"); ok {
		t.Errorf("Node(n1) = %+v after its last attachment went; want forgotten", info)
	}
}

func TestActualStateAttachedElsewhere(t *testing.T) {
	a := NewActualState()
	a.Update(k(ebsCSI, "n1"), true, set(Attachment{State: Attached}))
	a.Update(k(ebsCSI, "n2"), true, set(Attachment{State: Uncertain}))
	a.Update(k(ebsInTree, "n3"), true, set(Attachment{State: Detaching}))
	a.Update(k(volA, "n4"), true, set(Attachment{State: Attached}))
	tests := []struct {
		name  string
		names []volume.Name
		node  string
		want  []Key
	}{
		{name: "every name, every state", names: []volume.Name{ebsInTree, ebsCSI}, node: "n1", want: []Key{k(ebsCSI, "n2"), k(ebsInTree, "n3")}},
		{name: "one name", names: []volume.Name{ebsCSI}, node: "n9", want: []Key{k(ebsCSI, "n1"), k(ebsCSI, "n2")}},
		{name: "only on this node", names: []volume.Name{volA}, node: "n4", want: nil},
		{name: "nowhere", names: []volume.Name{volB}, node: "n1", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := a.AttachedElsewhere(tt.names, tt.node)
			if !sameKeys(got, tt.want) {
				t.Errorf("AttachedElsewhere(%v, %s) = %v, want %v", tt.names, tt.node, got, tt.want)
			}
		})
	}
}

func TestActualStateNodesOfAndStats(t *testing.T) {
	a := NewActualState()
	a.Update(k(volA, "n1"), true, set(Attachment{State: Attached}))
	a.Update(k(volA, "n2"), true, set(Attachment{State: Uncertain}))
	a.Update(k(volB, "n1"), true, set(Attachment{State: Detaching}))
	a.Update(k(volD, "n1"), true, set(Attachment{State: Attached}))
	nodes := a.NodesOf(volA)
	if len(nodes) != 2 || !(nodes[0] == "n1" && nodes[1] == "n2" || nodes[0] == "n2" && nodes[1] == "n1") {
		t.Errorf("NodesOf(a) = %v, want n1 and n2", nodes)
	}
	if nodes := a.NodesOf(volC); len(nodes) != 0 {
		t.Errorf("NodesOf(c) = %v, want none", nodes)
	}
	want := map[string]int{"kubernetes.io/csi:d.example.com": 3, "kubernetes.io/iscsi": 1}
	if got := a.Stats(); !reflect.DeepEqual(got, want) {
		t.Errorf("Stats() = %v, want %v", got, want)
	}
}

func av(name volume.Name, devicePath string) v1.AttachedVolume {
	return v1.AttachedVolume{Name: v1.UniqueVolumeName(name), DevicePath: devicePath}
}

// TestActualStateReport runs the node status report protocol: BeginReport,
// the write, EndReport; ObserveReport when the Node object says otherwise.
func TestActualStateReport(t *testing.T) {
	// Each step is one call of the protocol.
	type step struct {
		begin   bool // BeginReport; else EndReport of the last BeginReport's list (or of written)
		end     bool
		ok      bool
		written []v1.AttachedVolume // for end: when nil, the last BeginReport's list
		observe []v1.AttachedVolume // ObserveReport(seen)
		update  *Key                // mark this attachment Withdrawn
		attach  *Key                // create this attachment, Attached

		wantList     []v1.AttachedVolume
		wantChanged  bool
		wantKeys     []Key // for end
		wantInFlight bool
		wantReported []v1.AttachedVolume
	}
	kA, kB, kC := k(volA, "n1"), k(volB, "n1"), k(volC, "n1")
	tests := []struct {
		name        string
		attachments []Attachment
		steps       []step
	}{
		{
			name: "only attached and not withdrawn volumes are reported, sorted",
			attachments: []Attachment{
				{Key: kC, State: Attached, DevicePath: "/dev/c"},
				{Key: kA, State: Attached},
				{Key: kB, State: Attached, Withdrawn: true},
				{Key: k(volD, "n1"), State: Uncertain},
				{Key: k("kubernetes.io/csi/d.example.com^e", "n1"), State: Detaching},
				{Key: k(volA, "n2"), State: Attached},
			},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kA, kB, kC}, wantReported: []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "/dev/c")}, wantChanged: false, wantInFlight: false},
			},
		},
		{
			name:  "node with nothing attached: nothing to report",
			steps: []step{{begin: true, wantList: nil, wantChanged: false}},
		},
		{
			name:        "withdrawal confirmed by a successful write",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}, {Key: kB, State: Attached, Reported: true}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volB, "")}, wantChanged: false},
				{update: &kB, wantReported: []v1.AttachedVolume{av(volA, ""), av(volB, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kB}, wantReported: []v1.AttachedVolume{av(volA, "")}},
			},
		},
		{
			name:        "failed write: written volumes count as reported, reported ones stay",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}, {Key: kB, State: Attached, Reported: true, Withdrawn: true}, {Key: kC, State: Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: false, wantKeys: []Key{kB, kC}, wantReported: []v1.AttachedVolume{av(volA, ""), av(volB, ""), av(volC, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volC, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kB}, wantReported: []v1.AttachedVolume{av(volA, ""), av(volC, "")}},
			},
		},
		{
			name:        "failed write of an added volume is written again",
			attachments: []Attachment{{Key: kA, State: Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: false, wantKeys: []Key{kA}, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: nil, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: false},
			},
		},
		{
			name:        "a volume attached during the write is reported by the next one",
			attachments: []Attachment{{Key: kA, State: Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{attach: &kB, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kA}, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, ""), av(volB, "")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "node missing: empty report confirmed",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true, Withdrawn: true}, {Key: kB, State: Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volB, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, written: []v1.AttachedVolume{}, wantKeys: []Key{kA}, wantReported: nil},
			},
		},
		{
			name:        "phantom volume in node status: next report changed until written",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, ""), av("kubernetes.io/csi/d.example.com^ghost", "")}, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: nil, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: false},
			},
		},
		{
			name:        "phantom still there after a failed write",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, ""), av("kubernetes.io/csi/d.example.com^ghost", "")}, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: false, wantKeys: nil, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "reported volume with another device path in node status",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true, DevicePath: "/dev/sdb"}},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, "/dev/sdc")}, wantReported: []v1.AttachedVolume{av(volA, "/dev/sdb")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "/dev/sdb")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "reported volume listed twice in node status",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volA, ""), av(volA, "")}, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
			},
		},
		{
			name:        "node status as reported: no write",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true, DevicePath: "/dev/sdb"}, {Key: kB, State: Attached, Reported: true}},
			steps: []step{
				{observe: []v1.AttachedVolume{av(volB, ""), av(volA, "/dev/sdb")}, wantReported: []v1.AttachedVolume{av(volA, "/dev/sdb"), av(volB, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "/dev/sdb"), av(volB, "")}, wantChanged: false},
			},
		},
		{
			name:        "reported volume missing from node status",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}, {Key: kB, State: Uncertain}},
			steps: []step{
				// The object may predate a write that listed A: A stays
				// reported, B (listed) counts as reported until written.
				{observe: []v1.AttachedVolume{av(volB, "")}, wantReported: []v1.AttachedVolume{av(volA, ""), av(volB, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kB}, wantReported: []v1.AttachedVolume{av(volA, "")}},
			},
		},
		{
			// An informer event older than the controller's last write
			// must not make a withdrawn volume look unlisted: its detach
			// would start while the node status may still list it.
			name:        "stale observation never clears reported",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true, Withdrawn: true}},
			steps: []step{
				{observe: nil, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: nil, wantChanged: true, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kA}, wantReported: nil},
			},
		},
		{
			// Someone may have written after the write landed: the node
			// status is written again.
			name:        "observation during a write is taken when it ends",
			attachments: []Attachment{{Key: kA, State: Attached}},
			steps: []step{
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
				{observe: []v1.AttachedVolume{av("kubernetes.io/csi/d.example.com^ghost", "")}, wantInFlight: true},
				{end: true, ok: true, wantKeys: []Key{kA}, wantReported: []v1.AttachedVolume{av(volA, "")}},
				{begin: true, wantList: []v1.AttachedVolume{av(volA, "")}, wantChanged: true, wantInFlight: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			a.SetNode("n1", NodeInfo{Managed: true, Ready: true})
			for _, at := range tt.attachments {
				a.Update(at.Key, true, set(at))
			}
			var last []v1.AttachedVolume
			for i, s := range tt.steps {
				switch {
				case s.begin:
					list, changed := a.BeginReport("n1")
					if !reflect.DeepEqual(list, s.wantList) || changed != s.wantChanged {
						t.Errorf("step %d: BeginReport = %v, %v; want %v, %v", i, list, changed, s.wantList, s.wantChanged)
					}
					last = list
				case s.end:
					written := last
					if s.written != nil {
						written = s.written
					}
					keys := a.EndReport("n1", written, s.ok)
					if !sameKeys(keys, s.wantKeys) {
						t.Errorf("step %d: EndReport keys = %v, want %v", i, keys, s.wantKeys)
					}
				case s.observe != nil:
					a.ObserveReport("n1", s.observe)
				case s.update != nil:
					a.Update(*s.update, false, func(at *Attachment) { at.Withdrawn = true })
				case s.attach != nil:
					a.Update(*s.attach, true, func(at *Attachment) { at.State = Attached })
				}
				if got := a.ReportInFlight("n1"); got != s.wantInFlight {
					t.Errorf("step %d: ReportInFlight = %v, want %v", i, got, s.wantInFlight)
				}
				if s.end || s.observe != nil || s.update != nil {
					if got := a.Reported("n1"); !reflect.DeepEqual(got, s.wantReported) {
						t.Errorf("step %d: Reported = %v, want %v", i, got, s.wantReported)
					}
				}
			}
		})
	}
}

func TestActualStateAnnounced(t *testing.T) {
	if !(Attachment{}).Announced() {
		t.Errorf("an attachment with no attach started must count as announced")
	}
	if (Attachment{AttachStarted: time.Unix(1, 0)}).Announced() {
		t.Errorf("an attachment with an attach started must not count as announced")
	}
}
