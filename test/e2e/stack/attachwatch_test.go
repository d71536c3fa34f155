package stack

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func newTestWatch() *AttachmentWatch {
	return &AttachmentWatch{
		started:  time.Now(),
		vas:      map[string]*storagev1.VolumeAttachment{},
		listed:   map[string][]string{},
		pvs:      map[string]*v1.PersistentVolume{},
		pvOfName: map[string]string{},
		maxNodes: map[string]int{},
		active:   map[string]bool{},
	}
}

func testPV(name, handle string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes:            modes,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: MockDriver, VolumeHandle: handle}},
		},
	}
}

func testVA(pv, node string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "csi-" + pv + "-" + node},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: MockDriver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
}

func testNode(name string, attached ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range attached {
		n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: v1.UniqueVolumeName(a)})
	}
	return n
}

// TestAttachmentWatchMove: a volume that moves (old VolumeAttachment gone
// before the new one, the name dropped from one node before the other lists
// it) is no violation; the same with an overlap is one, recorded once
// however many updates it lasts.
func TestAttachmentWatchMove(t *testing.T) {
	const name = "kubernetes.io/csi/" + MockDriver + "^h1"
	for _, tc := range []struct {
		what    string
		overlap bool
		modes   []v1.PersistentVolumeAccessMode
		want    []string
	}{
		{what: "safe move", modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}},
		{what: "overlap", overlap: true, modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			want: []string{"VolumeAttachments on nodes a, b", "listed in volumesAttached of nodes a, b"}},
		{what: "overlap of a ReadWriteMany volume", overlap: true, modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce, v1.ReadWriteMany}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			w := newTestWatch()
			w.pvSeen(testPV("pv1", "h1", tc.modes...))
			w.vaSeen(testVA("pv1", "a"))
			w.nodeSeen(testNode("a", name))
			if !tc.overlap {
				w.nodeSeen(testNode("a"))
				w.vaGone(cache.DeletedFinalStateUnknown{Obj: testVA("pv1", "a")})
			}
			w.vaSeen(testVA("pv1", "b"))
			w.vaSeen(testVA("pv1", "b")) // an update: nothing new
			w.nodeSeen(testNode("b", name))
			w.nodeSeen(testNode("b", name))
			got := w.Violations()
			if len(got) != len(tc.want) {
				t.Fatalf("violations %q, want %d of them: %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("violation %d = %q, want it to say %q", i, got[i], tc.want[i])
				}
			}
			if want := map[bool]int{false: 1, true: 2}[tc.overlap]; w.MaxNodes("pv1") != want {
				t.Errorf("MaxNodes = %d, want %d", w.MaxNodes("pv1"), want)
			}
			if (w.Err() != nil) != (len(tc.want) > 0) {
				t.Errorf("Err() = %v with violations %q", w.Err(), got)
			}
		})
	}
}

// TestAttachmentWatchAgain: a violation that ends and starts again is
// recorded twice.
func TestAttachmentWatchAgain(t *testing.T) {
	w := newTestWatch()
	w.vaSeen(testVA("pv1", "a"))
	w.vaSeen(testVA("pv1", "b"))
	w.vaGone(testVA("pv1", "b"))
	w.vaSeen(testVA("pv1", "c"))
	if got := w.Violations(); len(got) != 2 {
		t.Errorf("violations %q, want 2 (a PV unknown to the watch counts as single-node)", got)
	}
}
