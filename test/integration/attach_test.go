package integration

import (
	"errors"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A pod with a bound CSI claim on a managed node gets its volume attached:
// the VolumeAttachment kube-controller-manager would create, then, once the
// attacher marks it attached, the node status entry kubelet waits for and an
// event on the pod.
func TestAttach(t *testing.T) {
	e := newEnv(t, "attach")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	pv := e.createCSIClaim("claim", driver, "vol-1")
	e.startController(nil)

	e.createPod("pod", node, "claim")
	name := framework.VolumeAttachmentName("vol-1", driver, node)
	va := e.waitVA(name)
	if va.Spec.Attacher != driver {
		t.Errorf("spec.attacher = %q, want %q", va.Spec.Attacher, driver)
	}
	if va.Spec.NodeName != node {
		t.Errorf("spec.nodeName = %q, want %q", va.Spec.NodeName, node)
	}
	if src := va.Spec.Source; src.PersistentVolumeName == nil || *src.PersistentVolumeName != pv.Name || src.InlineVolumeSpec != nil {
		t.Errorf("spec.source = %+v, want persistentVolumeName %q only", src, pv.Name)
	}
	if len(va.Finalizers) != 0 {
		t.Errorf("finalizers = %v, want none: the controller adds no finalizer", va.Finalizers)
	}
	if va.Status.Attached {
		t.Errorf("VolumeAttachment is attached before any attacher ran")
	}
	// Nothing is reported before the attacher confirms the attach.
	if _, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-1")); err != nil || listed {
		t.Errorf("node status lists the volume before it is attached (err %v)", err)
	}

	e.startAttacher(driver, "")
	e.waitAttached(driver, "vol-1", node)
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []v1.AttachedVolume{{Name: v1.UniqueVolumeName(framework.CSIVolumeName(driver, "vol-1")), DevicePath: ""}}
	if fmt.Sprint(n.Status.VolumesAttached) != fmt.Sprint(want) {
		t.Errorf("node.status.volumesAttached = %+v, want %+v", n.Status.VolumesAttached, want)
	}
	e.waitEvent("pod", v1.EventTypeNormal, "SuccessfulAttachVolume",
		fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv.Name))
}

// When the pod is deleted and the volume is not mounted, the volume leaves
// node.status.volumesAttached and only then is its VolumeAttachment deleted.
func TestDetachUnmounted(t *testing.T) {
	e := newEnv(t, "detach")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.startController(nil)

	e.createPod("pod", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)

	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", va.Name).String(),
		ResourceVersion: va.ResourceVersion,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	e.deletePod("pod")

	// At the moment the VolumeAttachment is deleted, the node status must
	// already have stopped listing the volume: kubelet could otherwise start
	// a mount on a volume being detached.
	timeout := time.After(waitTimeout)
	for deleted := false; !deleted; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("VolumeAttachment watch ended")
			}
			deleted = ev.Type == watch.Deleted
		case <-timeout:
			t.Fatalf("VolumeAttachment %s not deleted %s after the pod was", va.Name, waitTimeout)
		}
	}
	if _, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-1")); err != nil || listed {
		t.Errorf("node status still lists the volume when its VolumeAttachment is deleted (err %v)", err)
	}
	e.waitDetached(driver, "vol-1", node)
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Status.VolumesAttached) != 0 {
		t.Errorf("node.status.volumesAttached = %v, want empty", n.Status.VolumesAttached)
	}
}

// A volume listed in node.status.volumesInUse of a Ready node is never
// detached; once kubelet reports it unmounted, it is.
func TestDetachWaitsForUnmount(t *testing.T) {
	e := newEnv(t, "unmount")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.MaxWaitForUnmount = 2 * time.Second })

	// kubelet reports the volume in use as soon as it means to mount it,
	// before it is attached: long before the pod is deleted.
	e.setVolumesInUse(node, framework.CSIVolumeName(driver, "vol-1"))
	e.createPod("pod", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)
	vw := e.watchVA(va)

	e.deletePod("pod")
	// Longer than the max wait for unmount: a healthy node is never forced.
	framework.Consistently(t, 3*time.Second, func() error {
		_, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-1"))
		if err == nil && !listed {
			err = errors.New("node status no longer lists it")
		}
		return errors.Join(err, vw.intact())
	}, "the mounted volume to stay attached and listed in node status")
	if d := vw.deletions(); len(d) != 0 {
		t.Fatalf("VolumeAttachment of a mounted volume: %v", d)
	}

	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-1", node)
}

// A VolumeAttachment deleted by someone else while its volume is still
// wanted is created again, and the volume attached again.
func TestRecreateDeletedAttachment(t *testing.T) {
	e := newEnv(t, "recreate")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.startController(nil)

	e.createPod("pod", node, "claim")
	old := e.waitAttached(driver, "vol-1", node)
	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		va, ok, err := e.getVA(old.Name)
		if err != nil || !ok {
			return false, err
		}
		return va.UID != old.UID && va.Status.Attached, nil
	}, "VolumeAttachment %s recreated and attached", old.Name)
	e.waitAttached(driver, "vol-1", node)
}

// An attach error reported by the attacher reaches the pod as a Warning
// event, and the volume is not reported attached; a good volume of the same
// pod attaches.
func TestAttachError(t *testing.T) {
	e := newEnv(t, "attacherr")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	bad := e.createCSIClaim("bad", driver, "fail-x")
	e.createCSIClaim("good", driver, "vol-1")
	e.startAttacher(driver, "fail-")
	ctrl := e.startController(nil)

	e.createPod("pod", node, "bad", "good")
	e.waitAttached(driver, "vol-1", node)
	e.waitEvent("pod", v1.EventTypeWarning, "FailedAttachVolume",
		fmt.Sprintf("AttachVolume.Attach failed for volume %q : %s", bad.Name, framework.AttachFailureMessage("fail-x")))

	va, ok, err := e.getVA(framework.VolumeAttachmentName("fail-x", driver, node))
	if err != nil || !ok {
		t.Fatalf("VolumeAttachment of the failing volume: exists %v, err %v", ok, err)
	}
	if va.Status.Attached || va.Status.AttachError == nil {
		t.Errorf("failing VolumeAttachment status = %+v, want attachError", va.Status)
	}
	if _, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "fail-x")); err != nil || listed {
		t.Errorf("node status lists a volume that failed to attach (err %v)", err)
	}
	assertRunning(t, ctrl)
}
