package cache

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	ebsInTree = volume.Name("kubernetes.io/aws-ebs/vol-1")
	ebsCSI    = volume.Name("kubernetes.io/csi/ebs.csi.aws.com^vol-1")
)

func csiSpec(handle string) *volume.Spec {
	return &volume.Spec{
		Name:         volume.CSIName("d.example.com", handle),
		Kind:         volume.KindCSI,
		PluginName:   volume.CSIPluginName,
		Driver:       "d.example.com",
		VolumeHandle: handle,
		PVName:       "pv-" + handle,
		SingleNode:   true,
	}
}

// inTreeWithAlias is a migratable EBS volume the node attaches in-tree (or,
// pending, can't decide yet): its CSI name is an alias.
func inTreeWithAlias(pending string) *volume.Spec {
	s := &volume.Spec{
		Name:         ebsInTree,
		Aliases:      []volume.Name{ebsCSI},
		PluginName:   "kubernetes.io/aws-ebs",
		Driver:       "ebs.csi.aws.com",
		VolumeHandle: "vol-1",
		PVName:       "pv-ebs",
		SingleNode:   true,
		Pending:      pending,
	}
	if pending == "" {
		s.Kind = volume.KindInTree
	}
	return s
}

func readOnly(s *volume.Spec) *volume.Spec {
	c := *s
	c.ReadOnly = true
	return &c
}

func k(v volume.Name, node string) Key { return Key{Volume: v, Node: node} }

func sortKeys(keys []Key) []Key {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, func(a, b Key) int { return strings.Compare(a.String(), b.String()) })
	return keys
}

// sameKeys compares key lists in any order, duplicates included.
func sameKeys(got, want []Key) bool {
	if len(got) == 0 || len(want) == 0 {
		return len(got) == len(want)
	}
	return reflect.DeepEqual(sortKeys(got), sortKeys(want))
}

func TestDesiredStateSetPod(t *testing.T) {
	a, b := csiSpec("a"), csiSpec("b")
	podA := PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"}
	podB := PodRef{Namespace: "ns", Name: "pod-b", UID: "uid-b"}

	type op struct {
		pod    PodRef
		node   string
		specs  []*volume.Spec
		delete bool // DeletePod instead of SetPod
		want   []Key
	}
	tests := []struct {
		name string
		ops  []op
		// wantPods is the final desired state: key -> names of the pods
		// wanting it.
		wantPods map[Key][]string
	}{
		{
			name: "add two volumes",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a, b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
			},
			wantPods: map[Key][]string{k(a.Name, "n1"): {"pod-a"}, k(b.Name, "n1"): {"pod-a"}},
		},
		{
			name: "same specs again touch nothing",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a, b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
				{pod: podA, node: "n1", specs: []*volume.Spec{csiSpec("b"), csiSpec("a")}, want: nil},
			},
			wantPods: map[Key][]string{k(a.Name, "n1"): {"pod-a"}, k(b.Name, "n1"): {"pod-a"}},
		},
		{
			name: "replace one volume by another",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n1")}},
				{pod: podA, node: "n1", specs: []*volume.Spec{b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
			},
			wantPods: map[Key][]string{k(b.Name, "n1"): {"pod-a"}},
		},
		{
			name: "a changed spec under the same name touches its key once",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a, b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
				{pod: podA, node: "n1", specs: []*volume.Spec{readOnly(a), b}, want: []Key{k(a.Name, "n1")}},
			},
			wantPods: map[Key][]string{k(a.Name, "n1"): {"pod-a"}, k(b.Name, "n1"): {"pod-a"}},
		},
		{
			name: "remove with nil specs",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a, b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
				{pod: podA, node: "n1", specs: nil, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
			},
			wantPods: map[Key][]string{},
		},
		{
			name: "pod moved to another node",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n1")}},
				{pod: podA, node: "n2", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n1"), k(a.Name, "n2")}},
			},
			wantPods: map[Key][]string{k(a.Name, "n2"): {"pod-a"}},
		},
		{
			name: "two pods share a volume until both are gone",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n1")}},
				{pod: podB, node: "n1", specs: []*volume.Spec{a, b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
				{pod: podA, node: "n1", specs: nil, want: []Key{k(a.Name, "n1")}},
			},
			wantPods: map[Key][]string{k(a.Name, "n1"): {"pod-b"}, k(b.Name, "n1"): {"pod-b"}},
		},
		{
			name: "two pods on two nodes",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n1")}},
				{pod: podB, node: "n2", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n2")}},
			},
			wantPods: map[Key][]string{k(a.Name, "n1"): {"pod-a"}, k(a.Name, "n2"): {"pod-b"}},
		},
		{
			name: "DeletePod",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a, b}, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
				{pod: podB, node: "n1", specs: []*volume.Spec{a}, want: []Key{k(a.Name, "n1")}},
				{pod: podA, delete: true, want: []Key{k(a.Name, "n1"), k(b.Name, "n1")}},
				{pod: podA, delete: true, want: nil},
			},
			wantPods: map[Key][]string{k(a.Name, "n1"): {"pod-b"}},
		},
		{
			name: "DeletePod of an unknown pod",
			ops: []op{
				{pod: podA, delete: true, want: nil},
			},
			wantPods: map[Key][]string{},
		},
		{
			name: "two pod volumes naming the same volume count once",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{a, csiSpec("a")}, want: []Key{k(a.Name, "n1")}},
				{pod: podA, node: "n1", specs: nil, want: []Key{k(a.Name, "n1")}},
			},
			wantPods: map[Key][]string{},
		},
		{
			name: "pending spec decided: the volume changes name",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{inTreeWithAlias("no CSINode")}, want: []Key{k(ebsInTree, "n1"), k(ebsCSI, "n1")}},
				{pod: podA, node: "n1", specs: []*volume.Spec{{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI, Migrated: true}},
					want: []Key{k(ebsInTree, "n1"), k(ebsCSI, "n1")}},
			},
			wantPods: map[Key][]string{k(ebsCSI, "n1"): {"pod-a"}},
		},
		{
			name: "a volume with an alias touches the alias key too, on add and remove",
			ops: []op{
				{pod: podA, node: "n1", specs: []*volume.Spec{inTreeWithAlias(""), a}, want: []Key{k(ebsInTree, "n1"), k(ebsCSI, "n1"), k(a.Name, "n1")}},
				{pod: podB, node: "n1", specs: []*volume.Spec{inTreeWithAlias("")}, want: []Key{k(ebsInTree, "n1"), k(ebsCSI, "n1")}},
				{pod: podA, delete: true, want: []Key{k(ebsInTree, "n1"), k(ebsCSI, "n1"), k(a.Name, "n1")}},
				{pod: podB, delete: true, want: []Key{k(ebsInTree, "n1"), k(ebsCSI, "n1")}},
			},
			wantPods: map[Key][]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDesiredState()
			for i, o := range tt.ops {
				var got []Key
				if o.delete {
					got = d.DeletePod(o.pod.String())
				} else {
					got = d.SetPod(o.pod, o.node, o.specs)
				}
				if !sameKeys(got, o.want) {
					t.Errorf("op %d: touched %v, want %v", i, got, o.want)
				}
			}
			gotPods := map[Key][]string{}
			for _, key := range d.Keys() {
				spec, pods, ok := d.Get(key)
				if !ok || spec == nil {
					t.Errorf("Get(%s) = %v, %v; listed by Keys", key, spec, ok)
				}
				for _, p := range pods {
					gotPods[key] = append(gotPods[key], p.Name)
				}
			}
			if !reflect.DeepEqual(gotPods, tt.wantPods) {
				t.Errorf("desired pods = %v, want %v", gotPods, tt.wantPods)
			}
			if len(tt.wantPods) == 0 && (len(d.names) != 0 || len(d.entries) != 0 || len(d.counts) != 0) {
				t.Errorf("index not emptied: names=%v entries=%d counts=%v", d.names, len(d.entries), d.counts)
			}
			for key, p := range d.pods {
				// A pod read that wants nothing stays, read (Read).
				if len(p.specs) == 0 && len(p.vols) != 0 {
					t.Errorf("pod %s wants nothing but keeps volumes %v", key, p.vols)
				}
			}
		})
	}
}

func TestDesiredStateGetKeepsNewestSpecAndSortsPods(t *testing.T) {
	d := NewDesiredState()
	first, newer := csiSpec("a"), csiSpec("a")
	d.SetPod(PodRef{Namespace: "ns2", Name: "p"}, "n1", []*volume.Spec{first})
	d.SetPod(PodRef{Namespace: "ns1", Name: "z"}, "n1", []*volume.Spec{first})
	d.SetPod(PodRef{Namespace: "ns1", Name: "b"}, "n1", []*volume.Spec{first})
	if got := d.SetPod(PodRef{Namespace: "ns2", Name: "p"}, "n1", []*volume.Spec{newer}); len(got) != 0 {
		t.Errorf("same spec touched %v", got)
	}
	spec, pods, ok := d.Get(k(first.Name, "n1"))
	if !ok || spec != newer {
		t.Errorf("Get spec = %p, %v; want the newest %p", spec, ok, newer)
	}
	want := []PodRef{{Namespace: "ns1", Name: "b"}, {Namespace: "ns1", Name: "z"}, {Namespace: "ns2", Name: "p"}}
	if !reflect.DeepEqual(pods, want) {
		t.Errorf("pods = %v, want %v", pods, want)
	}
	if _, _, ok := d.Get(k(first.Name, "n2")); ok {
		t.Errorf("Get on another node found the volume")
	}
}

func TestDesiredStateAliases(t *testing.T) {
	podA := PodRef{Namespace: "ns", Name: "pod-a"}
	podB := PodRef{Namespace: "ns", Name: "pod-b"}
	tests := []struct {
		name       string
		set        func(d *DesiredState)
		wantWanted map[Key]bool
		wantKeys   map[volume.Name][]Key
		wantGet    map[Key]bool
	}{
		{
			name: "in-tree name with a CSI alias",
			set: func(d *DesiredState) {
				d.SetPod(podA, "n1", []*volume.Spec{inTreeWithAlias("")})
			},
			wantWanted: map[Key]bool{
				k(ebsInTree, "n1"): true, k(ebsCSI, "n1"): true,
				k(ebsInTree, "n2"): false, k(ebsCSI, "n2"): false,
			},
			wantKeys: map[volume.Name][]Key{
				ebsInTree: {k(ebsInTree, "n1")},
				ebsCSI:    {k(ebsInTree, "n1")},
				"other":   nil,
			},
			wantGet: map[Key]bool{k(ebsInTree, "n1"): true, k(ebsCSI, "n1"): false},
		},
		{
			name: "alias kept while a second pod wants it",
			set: func(d *DesiredState) {
				d.SetPod(podA, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.SetPod(podB, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.DeletePod(podA.String())
			},
			wantWanted: map[Key]bool{k(ebsInTree, "n1"): true, k(ebsCSI, "n1"): true},
			wantKeys:   map[volume.Name][]Key{ebsCSI: {k(ebsInTree, "n1")}},
			wantGet:    map[Key]bool{k(ebsInTree, "n1"): true},
		},
		{
			name: "alias gone with the last pod",
			set: func(d *DesiredState) {
				d.SetPod(podA, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.SetPod(podB, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.DeletePod(podA.String())
				d.DeletePod(podB.String())
			},
			wantWanted: map[Key]bool{k(ebsInTree, "n1"): false, k(ebsCSI, "n1"): false},
			wantKeys:   map[volume.Name][]Key{ebsCSI: nil, ebsInTree: nil},
			wantGet:    map[Key]bool{k(ebsInTree, "n1"): false},
		},
		{
			name: "same volume decided differently on two nodes",
			set: func(d *DesiredState) {
				d.SetPod(podA, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.SetPod(podB, "n2", []*volume.Spec{{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI}})
			},
			wantWanted: map[Key]bool{k(ebsCSI, "n1"): true, k(ebsInTree, "n2"): true},
			wantKeys: map[volume.Name][]Key{
				ebsCSI:    {k(ebsInTree, "n1"), k(ebsCSI, "n2")},
				ebsInTree: {k(ebsInTree, "n1"), k(ebsCSI, "n2")},
			},
			wantGet: map[Key]bool{k(ebsInTree, "n1"): true, k(ebsCSI, "n2"): true, k(ebsCSI, "n1"): false},
		},
		{
			name: "wanted on three nodes, then on one again",
			set: func(d *DesiredState) {
				podC := PodRef{Namespace: "ns", Name: "pod-c"}
				d.SetPod(podA, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.SetPod(podB, "n2", []*volume.Spec{{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI}})
				d.SetPod(podC, "n3", []*volume.Spec{inTreeWithAlias("")})
				d.DeletePod(podC.String())
				d.DeletePod(podB.String())
				// A second pod volume on n1 after the name is down to one use.
				d.SetPod(podB, "n1", []*volume.Spec{inTreeWithAlias("")})
				d.DeletePod(podA.String())
			},
			wantWanted: map[Key]bool{
				k(ebsInTree, "n1"): true, k(ebsCSI, "n1"): true,
				k(ebsCSI, "n2"): false, k(ebsInTree, "n2"): false, k(ebsInTree, "n3"): false,
			},
			wantKeys: map[volume.Name][]Key{ebsCSI: {k(ebsInTree, "n1")}, ebsInTree: {k(ebsInTree, "n1")}},
			wantGet:  map[Key]bool{k(ebsInTree, "n1"): true, k(ebsCSI, "n2"): false, k(ebsInTree, "n3"): false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDesiredState()
			tt.set(d)
			for key, want := range tt.wantWanted {
				if got := d.Wanted(key); got != want {
					t.Errorf("Wanted(%s) = %v, want %v", key, got, want)
				}
			}
			for name, want := range tt.wantKeys {
				if got := d.KeysFor(name); !sameKeys(got, want) {
					t.Errorf("KeysFor(%s) = %v, want %v", name, got, want)
				}
			}
			for key, want := range tt.wantGet {
				if _, _, got := d.Get(key); got != want {
					t.Errorf("Get(%s) found = %v, want %v", key, got, want)
				}
			}
		})
	}
}

func TestDesiredStateStats(t *testing.T) {
	tests := []struct {
		name        string
		pods        map[string][]*volume.Spec // pod name -> specs, all on n1
		wantPlugin  map[string]int
		wantPending int
	}{
		{name: "empty", wantPlugin: map[string]int{}},
		{
			name: "csi, in-tree and pending",
			pods: map[string][]*volume.Spec{
				"p1": {csiSpec("a"), csiSpec("b")},
				"p2": {csiSpec("a"), inTreeWithAlias("no CSINode")},
			},
			wantPlugin:  map[string]int{"kubernetes.io/csi:d.example.com": 2, "kubernetes.io/aws-ebs": 1},
			wantPending: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewDesiredState()
			d.SetCounted("n1", true)
			for name, specs := range tt.pods {
				d.SetPod(PodRef{Namespace: "ns", Name: name}, "n1", specs)
			}
			// The same pods on n2, which does not count.
			for name, specs := range tt.pods {
				d.SetPod(PodRef{Namespace: "other", Name: name}, "n2", specs)
			}
			byPlugin, pending := d.Stats()
			if !reflect.DeepEqual(byPlugin, tt.wantPlugin) || pending != tt.wantPending {
				t.Errorf("Stats() = %v, %d; want %v, %d", byPlugin, pending, tt.wantPlugin, tt.wantPending)
			}
			d.SetCounted("n1", false)
			if byPlugin, pending := d.Stats(); len(byPlugin) != 0 || pending != 0 {
				t.Errorf("no node counts: Stats() = %v, %d", byPlugin, pending)
			}
			d.SetCounted("n1", true)
			for name := range tt.pods {
				d.DeletePod("other/" + name)
				d.DeletePod("ns/" + name)
			}
			if byPlugin, pending := d.Stats(); len(byPlugin) != 0 || pending != 0 || len(d.counts) != 0 {
				t.Errorf("every pod gone: Stats() = %v, %d, counts of %d nodes", byPlugin, pending, len(d.counts))
			}
		})
	}
}

// Pods read while their node was unmanaged or missing: the node is partial
// until the last is read again, whatever the order; a pod of the same name
// marked on another node counts there only (the first node's set ends with
// it); a node gone forgets its own.
// A pod is read on its node from its first SetPod, wanting something or
// not, until DeletePod; a pod of the same name with another UID, or the
// same pod asked for on another node, is not.
func TestReadPods(t *testing.T) {
	d := NewDesiredState()
	a := PodRef{Namespace: "ns", Name: "a", UID: "u1"}
	if d.Read("ns/a", "u1", "n1") {
		t.Error("read before any SetPod")
	}
	d.SetPod(a, "n1", nil)
	if !d.Read("ns/a", "u1", "n1") {
		t.Error("a pod that wants nothing is not read")
	}
	if d.Read("ns/a", "u2", "n1") || d.Read("ns/a", "u1", "n2") {
		t.Error("read under another UID or on another node")
	}
	d.SetPod(a, "n1", []*volume.Spec{csiSpec("x")})
	if keys := d.DeletePod("ns/a"); len(keys) != 1 || d.Read("ns/a", "u1", "n1") {
		t.Errorf("after DeletePod: touched %v, read %v", keys, d.Read("ns/a", "u1", "n1"))
	}
	if keys := d.DeletePod("ns/a"); len(keys) != 0 {
		t.Errorf("deleted twice: touched %v", keys)
	}
}
