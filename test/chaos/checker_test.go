package chaos

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

const (
	rwo = "pv-rwo"
	rwx = "pv-rwx"
)

var (
	rwoName = "kubernetes.io/csi/mock.csi.example.com^h-rwo"
	rwxName = "kubernetes.io/csi/mock.csi.example.com^h-rwx"
)

func vaEvent(typ watch.EventType, rv, pv, node string, deleting bool) Event {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: pv + "@" + node, ResourceVersion: rv},
		Spec:       storagev1.VolumeAttachmentSpec{NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	if deleting {
		now := metav1.NewTime(time.Now())
		va.DeletionTimestamp = &now
	}
	return Event{Type: typ, VA: va}
}

func nodeEvent(rv, name string, readyNode, taint bool, attached, inUse []string) Event {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	st := v1.ConditionFalse
	if readyNode {
		st = v1.ConditionTrue
	}
	n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: st}}
	if taint {
		n.Spec.Taints = []v1.Taint{{Key: outOfService, Effect: v1.TaintEffectNoExecute}}
	}
	for _, a := range attached {
		n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: v1.UniqueVolumeName(a)})
	}
	for _, u := range inUse {
		n.Status.VolumesInUse = append(n.Status.VolumesInUse, v1.UniqueVolumeName(u))
	}
	return Event{Type: watch.Modified, Node: n}
}

// The checker catches each violation planted on purpose, and says nothing
// of clean histories, whatever order the watches delivered them in.
func TestCheckerCatchesPlantedViolations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events []Event
		want   string // "" for none
	}{
		{"clean handover: withdraw, unmount, detach, attach elsewhere", []Event{
			nodeEvent("10", "a", true, false, []string{rwoName}, []string{rwoName}),
			vaEvent(watch.Added, "11", rwo, "a", false),
			nodeEvent("12", "a", true, false, []string{rwoName}, nil),
			nodeEvent("13", "a", true, false, nil, nil),
			vaEvent(watch.Modified, "14", rwo, "a", true),
			vaEvent(watch.Deleted, "15", rwo, "a", true),
			vaEvent(watch.Added, "16", rwo, "b", false),
		}, ""},
		{"delivered out of order across watches", []Event{
			vaEvent(watch.Modified, "14", rwo, "a", true),
			nodeEvent("13", "a", true, false, nil, nil),
			nodeEvent("10", "a", true, false, []string{rwoName}, []string{rwoName}),
		}, ""},
		{"RWX on two nodes", []Event{
			vaEvent(watch.Added, "11", rwx, "a", false),
			vaEvent(watch.Added, "12", rwx, "b", false),
		}, ""},
		{"planted: RWO on two nodes", []Event{
			vaEvent(watch.Added, "11", rwo, "a", false),
			vaEvent(watch.Added, "12", rwo, "b", false),
		}, "I1: single-node volume pv-rwo has VolumeAttachments on nodes a, b"},
		{"planted: RWO attached elsewhere while its detach runs", []Event{
			vaEvent(watch.Added, "11", rwo, "a", false),
			vaEvent(watch.Modified, "12", rwo, "a", true),
			vaEvent(watch.Added, "13", rwo, "b", false),
		}, "I1:"},
		{"planted: detach of a volume mounted on a Ready node", []Event{
			nodeEvent("10", "a", true, false, nil, []string{rwoName}),
			vaEvent(watch.Modified, "14", rwo, "a", true),
		}, "I2: detach of pv-rwo from a started"},
		{"planted: detach of a volume mounted on a NotReady node", []Event{
			nodeEvent("10", "a", false, false, nil, []string{rwoName}),
			vaEvent(watch.Deleted, "14", rwo, "a", false),
			vaEvent(watch.Added, "9", rwo, "a", false),
		}, "I2:"},
		{"out-of-service taint allows it", []Event{
			nodeEvent("10", "a", false, true, nil, []string{rwoName}),
			vaEvent(watch.Modified, "14", rwo, "a", true),
		}, ""},
		{"planted: detach while node status lists it", []Event{
			vaEvent(watch.Modified, "14", rwo, "a", true),
			nodeEvent("10", "a", true, false, []string{rwoName}, nil),
		}, "I3: detach of pv-rwo from a started"},
		{"node status written after the detach started is not read", []Event{
			vaEvent(watch.Modified, "14", rwo, "a", true),
			nodeEvent("10", "a", true, false, nil, nil),
			nodeEvent("15", "a", true, false, []string{rwoName}, []string{rwoName}),
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(Volume{PV: rwo, SingleNode: true, Names: []string{rwoName}}, Volume{PV: rwx, Names: []string{rwxName}})
			for _, e := range tc.events {
				c.Record(e)
			}
			got := c.Violations()
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
				t.Errorf("violations %q, want one starting with %q", got, tc.want)
			}
		})
	}
}

func withUID(e Event, uid string) Event {
	e.VA.UID = types.UID(uid)
	return e
}

func tombstone(e Event) Event {
	e.Type = watch.Deleted
	e.Tombstone = true
	return e
}

// A detach someone else started is not judged, the controller's detach of
// the object re-created afterwards is; a detach within a stretch a watch
// missed is counted as unjudged; a tombstone ends an object without
// starting a detach.
func TestCheckerAttributesDetaches(t *testing.T) {
	mounted := nodeEvent("10", "a", true, false, []string{rwoName}, []string{rwoName})
	listed := nodeEvent("10", "a", true, false, []string{rwoName}, nil)
	for _, tc := range []struct {
		name     string
		events   []Event
		others   []string
		unseen   [][2]uint64
		want     string // "" for none
		unjudged int
	}{
		{"a third party deletes a VolumeAttachment in use", []Event{
			mounted,
			withUID(vaEvent(watch.Added, "11", rwo, "a", false), "1"),
			withUID(vaEvent(watch.Modified, "12", rwo, "a", true), "1"),
			withUID(vaEvent(watch.Deleted, "13", rwo, "a", true), "1"),
		}, []string{"1"}, nil, "", 0},
		{"planted: the controller detaches the one re-created after a third party's delete", []Event{
			listed,
			withUID(vaEvent(watch.Added, "11", rwo, "a", false), "1"),
			withUID(vaEvent(watch.Deleted, "12", rwo, "a", false), "1"),
			withUID(vaEvent(watch.Added, "13", rwo, "a", false), "2"),
			withUID(vaEvent(watch.Modified, "14", rwo, "a", true), "2"),
		}, []string{"1"}, nil, "I3: detach of pv-rwo from a started (resourceVersion 14)", 0},
		{"planted: the controller's delete is not excused by a third party's of another object", []Event{
			listed,
			withUID(vaEvent(watch.Added, "11", rwo, "a", false), "2"),
			withUID(vaEvent(watch.Modified, "14", rwo, "a", true), "2"),
		}, []string{"1"}, nil, "I3:", 0},
		{"a detach within what a watch missed is not judged", []Event{
			listed,
			vaEvent(watch.Added, "11", rwo, "a", false),
			vaEvent(watch.Added, "15", rwo, "a", true),
		}, nil, [][2]uint64{{11, 20}}, "", 1},
		{"planted: a detach after what a watch missed is judged", []Event{
			listed,
			vaEvent(watch.Added, "11", rwo, "a", false),
			vaEvent(watch.Modified, "21", rwo, "a", true),
		}, nil, [][2]uint64{{11, 20}}, "I3:", 0},
		{"a tombstone ends a VolumeAttachment without starting a detach", []Event{
			listed,
			vaEvent(watch.Added, "11", rwo, "a", false),
			tombstone(vaEvent(watch.Added, "11", rwo, "a", false)),
			vaEvent(watch.Added, "15", rwo, "b", false),
		}, nil, [][2]uint64{{11, 20}}, "", 0},
		{"planted: a tombstone of another UID leaves the object", []Event{
			withUID(vaEvent(watch.Added, "11", rwo, "a", false), "2"),
			tombstone(withUID(vaEvent(watch.Added, "11", rwo, "a", false), "1")),
			vaEvent(watch.Added, "15", rwo, "b", false),
		}, nil, nil, "I1:", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(Volume{PV: rwo, SingleNode: true, Names: []string{rwoName}})
			for _, uid := range tc.others {
				c.DeletedByOthers(types.UID(uid))
			}
			for _, g := range tc.unseen {
				c.Unseen(g[0], g[1])
			}
			for _, e := range tc.events {
				c.Record(e)
			}
			got, unjudged := c.Judge()
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
				t.Errorf("violations %q, want one starting with %q", got, tc.want)
			}
			if unjudged != tc.unjudged {
				t.Errorf("%d detaches unjudged, want %d", unjudged, tc.unjudged)
			}
		})
	}
}

func deletedNode(e Event) Event {
	e.Type = watch.Deleted
	return e
}

// I10: in a zone kept disrupted, no detach of a volume its node (NotReady,
// or deleted: as last written) lists in volumesInUse starts; the checker
// says nothing before the disruption, after it, on a node re-created with
// nothing mounted, or on a node of another zone (I2 judges that one).
func TestCheckerCatchesDetachesInADisruptedZone(t *testing.T) {
	mountedA := nodeEvent("10", "a", false, false, nil, []string{rwoName})
	for _, tc := range []struct {
		name   string
		events []Event
		want   string // "" for none
	}{
		{"planted: detach from a node deleted during the disruption", []Event{
			mountedA,
			vaEvent(watch.Added, "11", rwo, "a", false),
			deletedNode(nodeEvent("21", "a", false, false, nil, []string{rwoName})),
			vaEvent(watch.Modified, "25", rwo, "a", true),
		}, "I10: detach of pv-rwo from a (deleted, in volumesInUse) started (resourceVersion 25) while zone z is disrupted"},
		{"planted: detach from a NotReady node of the zone, reported once as I10", []Event{
			mountedA,
			vaEvent(watch.Added, "11", rwo, "a", false),
			vaEvent(watch.Modified, "25", rwo, "a", true),
		}, "I10: detach of pv-rwo from a (NotReady, in volumesInUse)"},
		{"planted: a tombstone is a deletion too", []Event{
			mountedA,
			vaEvent(watch.Added, "11", rwo, "a", false),
			tombstone(mountedA),
			vaEvent(watch.Modified, "25", rwo, "a", true),
		}, "I10: detach of pv-rwo from a (deleted"},
		{"detach from a deleted node after the disruption", []Event{
			mountedA,
			vaEvent(watch.Added, "11", rwo, "a", false),
			deletedNode(nodeEvent("21", "a", false, false, nil, []string{rwoName})),
			vaEvent(watch.Modified, "30", rwo, "a", true),
		}, ""},
		{"detach from a deleted node before the disruption", []Event{
			mountedA,
			vaEvent(watch.Added, "11", rwo, "a", false),
			deletedNode(nodeEvent("12", "a", false, false, nil, []string{rwoName})),
			vaEvent(watch.Modified, "13", rwo, "a", true),
		}, ""},
		{"detach from a node re-created with nothing mounted", []Event{
			mountedA,
			vaEvent(watch.Added, "11", rwo, "a", false),
			deletedNode(nodeEvent("21", "a", false, false, nil, []string{rwoName})),
			nodeEvent("23", "a", true, false, nil, nil),
			vaEvent(watch.Modified, "25", rwo, "a", true),
		}, ""},
		{"detach from a deleted node that had not mounted it", []Event{
			nodeEvent("10", "a", false, false, nil, nil),
			vaEvent(watch.Added, "11", rwo, "a", false),
			deletedNode(nodeEvent("21", "a", false, false, nil, nil)),
			vaEvent(watch.Modified, "25", rwo, "a", true),
		}, ""},
		{"out-of-service taint allows it", []Event{
			nodeEvent("10", "a", false, true, nil, []string{rwoName}),
			vaEvent(watch.Added, "11", rwo, "a", false),
			vaEvent(watch.Modified, "25", rwo, "a", true),
		}, ""},
		{"planted: a node of another zone is judged by I2", []Event{
			nodeEvent("10", "b", false, false, nil, []string{rwoName}),
			vaEvent(watch.Added, "11", rwo, "b", false),
			vaEvent(watch.Modified, "25", rwo, "b", true),
		}, "I2: detach of pv-rwo from b started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(Volume{PV: rwo, SingleNode: true, Names: []string{rwoName}})
			c.Disrupted("z", []string{"a", "c"}, 20, 29)
			for _, e := range tc.events {
				c.Record(e)
			}
			got := c.Violations()
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
				t.Errorf("violations %q, want one starting with %q", got, tc.want)
			}
		})
	}
}
