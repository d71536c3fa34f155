package stack

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

func runningPod(uid, node string, restarts int32) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-" + uid, UID: types.UID(uid)},
		Spec:       v1.PodSpec{NodeName: node},
		Status: v1.PodStatus{
			Phase:             v1.PodRunning,
			Conditions:        []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}},
			ContainerStatuses: []v1.ContainerStatus{{Name: "app", RestartCount: restarts}},
		},
	}
}

// protected returns a watch guarding pod p1 on node-1 with PV pv1, its
// VolumeAttachment va1 (UID u1) attached and listed in the node's status.
func protected(t *testing.T) (*DetachWatch, *storagev1.VolumeAttachment) {
	t.Helper()
	w := newDetachWatch(nil)
	const unique = "kubernetes.io/csi/" + MockDriver + "^h1"
	pv := "pv1"
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va1", UID: "u1", ResourceVersion: "10"},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: MockDriver, NodeName: "node-1", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true},
	}
	w.nodeSeen(testNode("node-1", unique))
	w.protect(runningPod("p1", "node-1", 0), []*protectedVolume{{
		pod: "p1", podName: "ns/pod-p1", pv: pv, node: "node-1", attachment: "va1", uid: "u1", unique: unique,
	}})
	w.vaSeen(va)
	if err := w.Err(); err != nil {
		t.Fatalf("a protected volume as it should be: %v", err)
	}
	return w, va
}

// TestDetachWatch plants each disturbance of a protected pod and its volume
// and checks that the watch records it, once.
func TestDetachWatch(t *testing.T) {
	const unique = "kubernetes.io/csi/" + MockDriver + "^h1"
	for _, tc := range []struct {
		name  string
		plant func(w *DetachWatch, va *storagev1.VolumeAttachment)
		want  string // "" for no violation
	}{
		{"another node's status", func(w *DetachWatch, _ *storagev1.VolumeAttachment) {
			w.nodeSeen(testNode("node-2"))
		}, ""},
		{"dropped from node status", func(w *DetachWatch, _ *storagev1.VolumeAttachment) {
			w.nodeSeen(testNode("node-1"))
			w.nodeSeen(testNode("node-1"))
		}, "status.volumesAttached dropped " + unique},
		{"VolumeAttachment being deleted", func(w *DetachWatch, va *storagev1.VolumeAttachment) {
			va.DeletionTimestamp = &metav1.Time{}
			w.vaSeen(va)
		}, "VolumeAttachment va1 of PV pv1 (pod ns/pod-p1) on node-1 being deleted"},
		{"VolumeAttachment deleted", func(w *DetachWatch, va *storagev1.VolumeAttachment) {
			w.vaGone(cache.DeletedFinalStateUnknown{Key: va.Name, Obj: va})
		}, "VolumeAttachment va1 of PV pv1 (pod ns/pod-p1) on node-1 deleted"},
		{"VolumeAttachment replaced", func(w *DetachWatch, va *storagev1.VolumeAttachment) {
			va.UID = "u2"
			w.vaSeen(va)
		}, "replaced: UID u2, was u1"},
		{"VolumeAttachment detached", func(w *DetachWatch, va *storagev1.VolumeAttachment) {
			va.Status.Attached = false
			w.vaSeen(va)
		}, "no longer attached"},
		{"pod not Ready", func(w *DetachWatch, _ *storagev1.VolumeAttachment) {
			p := runningPod("p1", "node-1", 0)
			p.Status.Conditions[0].Status = v1.ConditionFalse
			w.podSeen(p)
		}, "pod ns/pod-p1 on node-1 not Ready"},
		{"container restarted", func(w *DetachWatch, _ *storagev1.VolumeAttachment) {
			w.podSeen(runningPod("p1", "node-1", 1))
		}, "a container restarted (1 restarts, 0 when protected)"},
		{"pod deleted", func(w *DetachWatch, _ *storagev1.VolumeAttachment) {
			w.podGone(runningPod("p1", "node-1", 0))
		}, "pod ns/pod-p1 on node-1 deleted"},
		{"released, then deleted and detached", func(w *DetachWatch, va *storagev1.VolumeAttachment) {
			w.Release(*runningPod("p1", "node-1", 0))
			w.podGone(runningPod("p1", "node-1", 0))
			w.nodeSeen(testNode("node-1"))
			w.vaGone(va)
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, va := protected(t)
			tc.plant(w, va)
			got := w.Violations()
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("violations %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Errorf("violations %q, want one with %q", got, tc.want)
			}
		})
	}
}

// TestDetachWatchNotListedYet: a volume protected before any node event
// listed it is not dropped by an event that does not list it yet.
func TestDetachWatchNotListedYet(t *testing.T) {
	const unique = "kubernetes.io/csi/" + MockDriver + "^h1"
	w := newDetachWatch(nil)
	w.protect(runningPod("p1", "node-1", 0), []*protectedVolume{{pod: "p1", node: "node-1", attachment: "va1", unique: unique}})
	w.nodeSeen(testNode("node-1"))
	w.nodeSeen(testNode("node-1", unique))
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	w.nodeSeen(testNode("node-1"))
	if len(w.Violations()) != 1 {
		t.Errorf("violations %q, want the drop after it was listed", w.Violations())
	}
}

// TestDetachWatchDeletions: a VolumeAttachment's deletion is recorded by
// resourceVersion, started (deletionTimestamp) and removed.
func TestDetachWatchDeletions(t *testing.T) {
	w := newDetachWatch(nil)
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va1", ResourceVersion: "5"}}
	w.vaSeen(va)
	if _, ok := w.Deletion(KindVolumeAttachment, "va1"); ok {
		t.Fatal("a deletion recorded for an object not being deleted")
	}
	va.DeletionTimestamp, va.ResourceVersion = &metav1.Time{}, "7"
	w.vaSeen(va)
	va.ResourceVersion = "8"
	w.vaSeen(va)
	va.ResourceVersion = "9"
	w.vaGone(va)
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1", ResourceVersion: "12"}}
	w.pvGone(pv)
	if d, _ := w.Deletion(KindVolumeAttachment, "va1"); d.Started != 7 || d.Removed != 9 {
		t.Errorf("VolumeAttachment deletion %+v, want started 7, removed 9", d)
	}
	if d, _ := w.Deletion(KindPersistentVolume, "pv1"); d.Started != 0 || d.Removed != 12 {
		t.Errorf("PV deletion %+v, want removed 12", d)
	}
}
