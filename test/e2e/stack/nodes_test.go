package stack

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Lines as kube-controller-manager v1.37.2 logs them (klog text format).
const controllerManagerLog = `I1128 02:43:36.516248   18071 node_lifecycle_controller.go:1133] "Controller detected that zone is now in new state" zone=":\x00:zone-b" newState="Normal"
I1128 02:43:36.516262   18071 node_lifecycle_controller.go:1133] "Controller detected that zone is now in new state" zone=":\x00:zone-a" newState="Normal"
I1128 02:44:12.616200   18071 node_lifecycle_controller.go:1133] "Controller detected that zone is now in new state" zone=":\x00:zone-a" newState="FullDisruption"
I1128 02:44:20.000001   18071 node_lifecycle_controller.go:1091] "Controller detected that all Nodes are not-Ready. Entering master disruption mode"
I1128 02:45:20.000001   18071 node_lifecycle_controller.go:1110] "Controller detected that some Nodes are Ready. Exiting master disruption mode"
I1128 02:51:03.915516   18218 reconciler.go:283] "attacherDetacher.DetachVolume started: this volume is not safe to detach, but maxWaitForUnmountDuration expired, force detaching" duration="6m0s" node="node-0" volumeName="kubernetes.io/csi/mock.csi.example.com^pvc-59ab"
I1128 02:51:04.000000   18218 reconciler.go:279] "attacherDetacher.DetachVolume started" node="node-1" volumeName="kubernetes.io/csi/mock.csi.example.com^pvc-1"
I1128 02:52:00.100000   18218 reconciler.go:289] "attacherDetacher.DetachVolume started: node has out-of-service taint, force detaching" node="node-2" volumeName="kubernetes.io/csi/mock.csi.example.com^pvc-2"
`

func TestZoneStates(t *testing.T) {
	got := ZoneStates(controllerManagerLog)
	want := []ZoneState{
		{Zone: "zone-b", State: "Normal"}, {Zone: "zone-a", State: "Normal"}, {Zone: "zone-a", State: "FullDisruption"},
		{Zone: "(all zones)", State: "FullDisruption"}, {Zone: "(all zones)", State: "Normal"},
	}
	if len(got) != len(want) {
		t.Fatalf("ZoneStates: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Zone != want[i].Zone || got[i].State != want[i].State {
			t.Errorf("state %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if at := got[2].At; at.Month() != time.November || at.Day() != 28 || at.Hour() != 2 || at.Minute() != 44 || at.Second() != 12 || at.Nanosecond() != 616200000 {
		t.Errorf("time of %+v: want Nov 28 02:44:12.6162 this year", got[2])
	}
}

func TestForcedDetaches(t *testing.T) {
	got := ForcedDetaches(controllerManagerLog)
	want := []ForcedDetach{
		{Node: "node-0", Volume: "kubernetes.io/csi/mock.csi.example.com^pvc-59ab", Reason: "timeout"},
		{Node: "node-2", Volume: "kubernetes.io/csi/mock.csi.example.com^pvc-2", Reason: "out-of-service"},
	}
	if len(got) != len(want) {
		t.Fatalf("ForcedDetaches: %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i].Node != want[i].Node || got[i].Volume != want[i].Volume || got[i].Reason != want[i].Reason || got[i].At.IsZero() {
			t.Errorf("forced detach %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestDetachLog(t *testing.T) {
	w := &DetachLog{deleting: map[string]bool{}, listed: map[string][]string{}, pvOfName: map[string]string{}}
	w.pvSeen(testPV("pv-1", "h1"))
	w.nodeSeen(testNode("node-0", "kubernetes.io/csi/"+MockDriver+"^h1", "kubernetes.io/csi/"+MockDriver+"^h2"))
	va := testVA("pv-1", "node-0")
	w.vaSeen(va)
	if got := w.Events(time.Time{}); len(got) != 0 {
		t.Fatalf("events before any detach: %v", got)
	}
	start := time.Now()
	w.nodeSeen(testNode("node-0", "kubernetes.io/csi/"+MockDriver+"^h2"))
	deleting := va.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	w.vaSeen(deleting)
	w.vaSeen(deleting)
	w.vaGone(cache.DeletedFinalStateUnknown{Key: va.Name, Obj: deleting})
	got := w.Events(start, "node-0")
	want := []DetachKind{Unlisted, DetachRequested, DetachDone}
	if len(got) != len(want) {
		t.Fatalf("events: %v, want kinds %v", got, want)
	}
	for i, k := range want {
		if got[i].Kind != k || got[i].Volume != "pv-1" || got[i].Node != "node-0" {
			t.Errorf("event %d: %v, want %s of pv-1 on node-0", i, got[i], k)
		}
	}
	if _, ok := w.First(DetachDone, "pv-1", "node-1", start); ok {
		t.Error("a detach on node-1, where nothing was")
	}
	// A VolumeAttachment gone without its deletion seen still counts both.
	w.vaGone(testVA("pv-2", "node-1"))
	if got := w.Events(start, "node-1"); len(got) != 2 || got[0].Kind != DetachRequested || got[1].Kind != DetachDone {
		t.Errorf("events of a VolumeAttachment gone at once: %v", got)
	}
}
