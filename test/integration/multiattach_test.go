package integration

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A ReadWriteOnce volume attached to one node is refused to a pod on another
// node, with the "Waiting for detach" warning (byte for byte
// kube-controller-manager's: test/e2e TestShadowOnTheWorkload), until the
// first node detaches it; then it is handed over.
func TestMultiAttachHandover(t *testing.T) {
	e := newEnv(t, "multiattach")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	pv := e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	// pod-a's second volume, never mounted, is detached as soon as the
	// controller has seen pod-a go: the test's sign that it has.
	e.createCSIClaim("marker", driver, "vol-marker")
	e.startAttacher(driver, "")
	e.startController(nil)

	// vol-1 is mounted on node 1 (reported in use from before the attach,
	// as kubelet does).
	e.setVolumesInUse(node1, framework.CSIVolumeName(driver, "vol-1"))
	e.createPod("pod-a", node1, "claim", "marker")
	e.waitAttached(driver, "vol-1", node1)
	e.waitAttached(driver, "vol-marker", node1)
	second := framework.VolumeAttachmentName("vol-1", driver, node2)
	noSecond := e.noVAFor(func(va *storagev1.VolumeAttachment) bool { return va.Name == second })

	// A pod of the same namespace holds it: the warning names that pod.
	e.createPod("pod-b", node2, "claim")
	e.waitEvent("pod-b", v1.EventTypeWarning, "FailedAttachVolume",
		framework.WaitingForDetachUsedBy(pv.Name, "pod-a"))
	framework.Consistently(t, quietPeriod, noSecond, "no VolumeAttachment for node %s while pod-a on node %s uses the volume", node2, node1)

	// No pod wants it on node 1 any more, but it is still mounted there. A
	// pod that comes now is told the volume is attached elsewhere. (Upstream
	// tells a waiting pod once: pod-b's later warnings are not asserted.)
	e.deletePod("pod-a")
	e.waitDetached(driver, "vol-marker", node1)
	e.createPod("pod-c", node2, "claim")
	e.waitEvent("pod-c", v1.EventTypeWarning, "FailedAttachVolume",
		framework.WaitingForDetachExclusive(pv.Name))
	framework.Consistently(t, quietPeriod, noSecond, "no VolumeAttachment for node %s while the volume is mounted on node %s", node2, node1)
	if _, ok, err := e.getVA(framework.VolumeAttachmentName("vol-1", driver, node1)); err != nil || !ok {
		t.Fatalf("VolumeAttachment on node %s: exists %v, err %v", node1, ok, err)
	}

	// Unmounted on node 1: detached there, then attached to node 2.
	e.setVolumesInUse(node1)
	e.waitDetached(driver, "vol-1", node1)
	e.waitAttached(driver, "vol-1", node2)
	e.waitEvent("pod-b", v1.EventTypeNormal, "SuccessfulAttachVolume",
		fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv.Name))
}

// A ReadWriteMany volume is attached to every node that wants it.
func TestReadWriteManyOnTwoNodes(t *testing.T) {
	e := newEnv(t, "rwx")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteMany)
	e.startAttacher(driver, "")
	e.startController(nil)

	e.createPod("pod-a", node1, "claim")
	e.createPod("pod-b", node2, "claim")
	e.waitAttached(driver, "vol-1", node1)
	e.waitAttached(driver, "vol-1", node2)
	for _, pod := range []string{"pod-a", "pod-b"} {
		warnings, err := e.warnings(pod)
		if err != nil {
			t.Fatal(err)
		}
		if len(warnings) != 0 {
			t.Errorf("pod %s: unexpected warnings %q", pod, warnings)
		}
	}
}

// Nothing is attached for a pod on a node the controller does not manage,
// nor for a CSI driver that needs no attach; a control volume on a managed
// node proves the controller is at work. Once the node becomes managed, its
// volume is attached.
func TestNoAttachUnmanagedOrNotRequired(t *testing.T) {
	e := newEnv(t, "noattach")
	driver := e.name("csi.test")
	noAttachDriver := e.name("noattach.csi.test")
	managed := e.createNode("managed", true)
	unmanaged := e.createNode("unmanaged", false)
	e.createCSIDriver(driver, new(true))
	e.createCSIDriver(noAttachDriver, new(false))
	e.createCSIClaim("unmanaged", driver, "vol-unmanaged")
	e.createCSIClaim("noattach", noAttachDriver, "vol-noattach")
	e.createCSIClaim("control", driver, "vol-control")
	e.startAttacher(driver, "")
	e.startAttacher(noAttachDriver, "")
	e.startController(nil)

	e.createPod("pod-unmanaged", unmanaged, "unmanaged")
	e.createPod("pod-noattach", managed, "noattach")
	e.createPod("pod-control", managed, "control")
	e.waitAttached(driver, "vol-control", managed)

	framework.Consistently(t, quietPeriod, e.noVAFor(func(va *storagev1.VolumeAttachment) bool {
		return va.Spec.NodeName == unmanaged || va.Spec.Attacher == noAttachDriver
	}), "no VolumeAttachment for the unmanaged node nor for the driver with attachRequired=false")
	for _, check := range []struct{ node, volume string }{
		{unmanaged, framework.CSIVolumeName(driver, "vol-unmanaged")},
		{managed, framework.CSIVolumeName(noAttachDriver, "vol-noattach")},
	} {
		if _, listed, err := e.attachedInStatus(check.node, check.volume); err != nil || listed {
			t.Errorf("node %s status lists %s (err %v)", check.node, check.volume, err)
		}
	}
	for _, pod := range []string{"pod-unmanaged", "pod-noattach"} {
		warnings, err := e.warnings(pod)
		if err != nil {
			t.Fatal(err)
		}
		if len(warnings) != 0 {
			t.Errorf("pod %s: unexpected warnings %q", pod, warnings)
		}
	}

	e.updateNode(unmanaged, func(n *v1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations["volumes.kubernetes.io/controller-managed-attach-detach"] = "true"
	})
	e.waitAttached(driver, "vol-unmanaged", unmanaged)
}

// A node whose kubelet stops and starts leaving attach and detach to the
// controller (the annotation removed, then put back) while a pod uses a
// volume there, not mounted yet: the volume is never detached, neither
// when its pod is read with the node unmanaged nor when the node is managed
// again before its pod is read again; a pod created while the node was
// unmanaged has its volume attached once it is managed.
func TestNodeManagementChangesDetachNothing(t *testing.T) {
	e := newEnv(t, "management")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIDriver(driver, new(true))
	e.createCSIClaim("kept", driver, "vol-kept")
	e.createCSIClaim("later", driver, "vol-later")
	e.startAttacher(driver, "")
	e.startController(nil)
	e.createPod("pod-kept", node, "kept")
	va := e.waitAttached(driver, "vol-kept", node)
	vw := e.watchVA(va)

	for round := range 5 {
		e.updateNode(node, func(n *v1.Node) { delete(n.Annotations, framework.ControllerManagedAnnotation) })
		if round == 0 {
			e.createPod("pod-later", node, "later")
		}
		e.updateNode(node, func(n *v1.Node) {
			if n.Annotations == nil {
				n.Annotations = map[string]string{}
			}
			n.Annotations[framework.ControllerManagedAnnotation] = "true"
		})
	}
	e.waitAttached(driver, "vol-later", node)
	framework.Consistently(t, quietPeriod, vw.intact, "the VolumeAttachment of a volume a running pod uses is never deleted")
}
