package cache

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

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
				a.SetNode("n1", *tt.before, time.Time{})
			}
			got, _ := a.SetNode("n1", tt.after, time.Time{})
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

// A node read with the controller-managed annotation after it was read
// without it, or deleted, is managed again from that read; the time is
// kept while the node has the annotation (also while it counts as
// unmanaged, its pods not read yet), and dropped when it loses it. A node
// annotated from its first read, held unmanaged until its pods are read,
// is not managed again.
func TestActualStateManagedAgain(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	managed := NodeInfo{Managed: true, Annotated: true, Ready: true, UID: "u1"}
	unmanaged := NodeInfo{Ready: true, UID: "u1"}
	type step struct {
		info   NodeInfo
		delete bool
		at     int
		want   int // -1: not managed again
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "managed from the first read", steps: []step{{info: managed, at: 1, want: -1}, {info: managed, at: 2, want: -1}}},
		{name: "unmanaged, then managed", steps: []step{{info: unmanaged, at: 1, want: -1}, {info: managed, at: 5, want: 5}, {info: managed, at: 9, want: 5}}},
		{name: "managed again, then unmanaged", steps: []step{{info: unmanaged, at: 1, want: -1}, {info: managed, at: 5, want: 5}, {info: unmanaged, at: 9, want: -1}}},
		{name: "managed again twice", steps: []step{{info: unmanaged, at: 1, want: -1}, {info: managed, at: 5, want: 5}, {info: unmanaged, at: 9, want: -1}, {info: managed, at: 12, want: 12}}},
		{name: "held until its pods are read", steps: []step{{info: NodeInfo{Annotated: true, Ready: true, UID: "u1"}, at: 1, want: -1}, {info: managed, at: 5, want: -1}}},
		{name: "managed again, held until its pods are read", steps: []step{{info: unmanaged, at: 1, want: -1}, {info: NodeInfo{Annotated: true, Ready: true, UID: "u1"}, at: 5, want: 5}, {info: managed, at: 9, want: 5}}},
		{name: "deleted, created again", steps: []step{{info: managed, at: 1, want: -1}, {delete: true, at: 3, want: -1}, {info: NodeInfo{Managed: true, Annotated: true, UID: "u2"}, at: 7, want: 7}}},
		// A relist shows the new object in place of the old: no deletion
		// is read, and the new object lists in use nothing its kubelet
		// mounted before it registered again.
		{name: "created again, its deletion not read", steps: []step{{info: managed, at: 1, want: -1}, {info: NodeInfo{Managed: true, Annotated: true, UID: "u2"}, at: 7, want: 7}, {info: NodeInfo{Managed: true, Annotated: true, UID: "u2"}, at: 9, want: 7}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			a.Update(k(volA, "n1"), true, set(Attachment{State: Attached}))
			for i, st := range tt.steps {
				if st.delete {
					a.DeleteNode("n1", true, at(st.at))
				} else {
					a.SetNode("n1", st.info, at(st.at))
				}
				n, _ := a.Node("n1")
				want := time.Time{}
				if st.want >= 0 {
					want = at(st.want)
				}
				if !n.ManagedAgain.Equal(want) {
					t.Errorf("step %d: ManagedAgain = %v, want %v", i, n.ManagedAgain, want)
				}
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
			wantInfo:    &NodeInfo{Exists: false, Deleted: true, Managed: true, Ready: false, OutOfService: false, Seen: true, InUse: map[volume.Name]bool{volA: true}},
		},
		{
			name:        "second delete touches nothing",
			attachments: []Key{k(volA, "n1")},
			seen:        true,
			deleteTwice: true,
			want:        nil,
			wantInfo:    &NodeInfo{Exists: false, Deleted: true, Managed: true, Ready: false, OutOfService: false, Seen: true, InUse: map[volume.Name]bool{volA: true}},
		},
		{name: "nothing attached: node forgotten", seen: true, want: []Key{}, wantInfo: nil},
		{
			// Deleted before this controller read it: its zone and what it
			// had mounted are unknown, and it is taken as managed.
			name: "never seen", attachments: []Key{k(volA, "n1")}, want: []Key{k(volA, "n1")},
			wantInfo: &NodeInfo{Deleted: true, Managed: true, Zone: UnknownZone},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			for _, key := range tt.attachments {
				a.Update(key, true, set(Attachment{State: Attached}))
			}
			if tt.seen {
				a.SetNode("n1", info, time.Time{})
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
	a.SetNode("n1", NodeInfo{Managed: true, Ready: true}, time.Time{})
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

func TestActualStateAnnounced(t *testing.T) {
	if !(Attachment{}).Announced() {
		t.Errorf("an attachment with no attach started must count as announced")
	}
	if (Attachment{AttachStarted: time.Unix(1, 0)}).Announced() {
		t.Errorf("an attachment with an attach started must not count as announced")
	}
}

// TestActualStateAttachmentStates: every attachment made through a
// VolumeAttachment, by its name and state; none made otherwise.
func TestActualStateAttachmentStates(t *testing.T) {
	a := NewActualState()
	a.Update(k(volA, "n1"), true, func(at *Attachment) { at.State = Attached; at.AttachmentName = "csi-1" })
	a.Update(k(volA, "n2"), true, func(at *Attachment) { at.State = Detaching; at.AttachmentName = "csi-2" })
	a.Update(k(volB, "n1"), true, func(at *Attachment) { at.State = Attached; at.DevicePath = "/dev/x" })
	got := a.AttachmentStates()
	slices.SortFunc(got, func(x, y NamedState) int { return strings.Compare(x.AttachmentName, y.AttachmentName) })
	want := []NamedState{{AttachmentName: "csi-1", State: Attached}, {AttachmentName: "csi-2", State: Detaching}}
	if !slices.Equal(got, want) {
		t.Errorf("AttachmentStates() = %v, want %v", got, want)
	}
}

// UpdateUnchanged applies only to the attachment as it was read: a change
// since (an event read while the API answered) wins over the answer. A
// write that changes nothing keeps it unchanged; a missing attachment is
// not created.
func TestActualStateUpdateUnchanged(t *testing.T) {
	a := NewActualState()
	key := k(volA, "n1")
	a.Update(key, true, func(at *Attachment) { at.State = Attached })
	seen, _ := a.Get(key)
	a.Update(key, false, func(at *Attachment) { at.State = Attached })
	if !a.UpdateUnchanged(key, seen, func(at *Attachment) { at.DevicePath = "/dev/x" }) {
		t.Fatal("not applied to the attachment as it was read (a write that changed nothing since)")
	}
	a.Update(key, false, func(at *Attachment) { at.State = Detaching })
	if a.UpdateUnchanged(key, seen, func(at *Attachment) { at.State = Attached }) {
		t.Error("applied to an attachment changed since it was read")
	}
	if got, _ := a.Get(key); got.State != Detaching || got.DevicePath != "/dev/x" {
		t.Errorf("%+v: want detaching, /dev/x", got)
	}
	if a.UpdateUnchanged(k(volB, "n1"), seen, func(*Attachment) {}) {
		t.Error("applied to a missing attachment")
	}
	if _, ok := a.Get(k(volB, "n1")); ok {
		t.Error("a missing attachment was created")
	}
}
