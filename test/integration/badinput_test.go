package integration

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Pods whose volumes can't be attached, for reasons of their own, neither
// stop the controller nor keep the good volumes around them from attaching.
// Those that are errors get a Warning on the pod; those that only wait (an
// unbound claim) or need no attach (nfs) stay quiet.
func TestBadInput(t *testing.T) {
	e := newEnv(t, "badinput")
	driver := e.name("csi.test")
	// No CSIDriver object: attach is required.
	noObjectDriver := e.name("noobject.csi.test")
	node := e.createNode("node", true)
	// kubelet says portworx volumes go through CSI here, but the driver is
	// not installed.
	e.createCSINode(node, []storagev1.CSINodeDriver{framework.CSINodeDriver(driver, node)}, "kubernetes.io/portworx-volume")
	e.createCSIDriver(driver, new(true))
	e.startAttacher(driver, "")
	e.startAttacher(noObjectDriver, "")
	ctrl := e.startController(nil)

	// A missing claim, next to a good volume in the same pod.
	e.createCSIClaim("good-1", driver, "vol-good-1")
	e.createPod("missing-claim", node, "no-such-claim", "good-1")

	// A claim bound to a PV that does not exist.
	ghost := framework.PVC(e.ns, "ghost", e.name("ghost-pv"))
	e.createPendingClaim(ghost)
	e.setClaimBound(ghost.Name)
	e.createPod("ghost-pv", node, "ghost")

	// An unbound claim: waiting, not an error.
	e.createPendingClaim(framework.PVC(e.ns, "unbound", ""))
	e.createPod("unbound", node, "unbound")

	// A PV whose claimRef names the claim but with another UID: not bound
	// to this claim (yet).
	mismatched := framework.PVC(e.ns, "mismatched", e.name("mismatched-pv"))
	e.createPendingClaim(mismatched)
	e.setClaimBound(mismatched.Name)
	wrongUID := mismatched.DeepCopy()
	wrongUID.UID = "00000000-0000-0000-0000-000000000000"
	e.createPV(framework.PV(e.name("mismatched-pv"), framework.CSISource(driver, "vol-mismatched"), wrongUID))
	e.createPod("mismatched", node, "mismatched")

	// nfs, inline and through a PV: nothing to attach.
	e.createClaim("nfs", v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "10.0.0.1", Path: "/pv"}})
	nfsPod := framework.Pod(e.ns, "nfs", node, append(framework.PVCVolumes("nfs"), v1.Volume{
		Name:         "inline-nfs",
		VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "10.0.0.1", Path: "/inline"}},
	})...)
	e.createPodObject(nfsPod)

	// An in-tree volume the node says is migrated to a driver it lacks.
	pxPod := framework.Pod(e.ns, "portworx", node, v1.Volume{
		Name:         "px",
		VolumeSource: v1.VolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "px-1"}},
	})
	e.createPodObject(pxPod)

	// Good volumes: one of a driver without CSIDriver object, one plain.
	e.createCSIClaim("no-object", noObjectDriver, "vol-no-object")
	e.createCSIClaim("good-2", driver, "vol-good-2")
	e.createPod("good", node, "no-object", "good-2")

	e.waitAttached(driver, "vol-good-1", node)
	e.waitAttached(noObjectDriver, "vol-no-object", node)
	e.waitAttached(driver, "vol-good-2", node)

	e.waitEvent("missing-claim", v1.EventTypeWarning, "FailedAttachVolume",
		fmt.Sprintf("AttachVolume.Attach failed for volume %q : PersistentVolumeClaim %q not found", "vol-0", e.ns+"/no-such-claim"))
	e.waitEvent("ghost-pv", v1.EventTypeWarning, "FailedAttachVolume",
		fmt.Sprintf("AttachVolume.Attach failed for volume %q : PersistentVolume %q of claim %q not found", "vol-0", e.name("ghost-pv"), e.ns+"/ghost"))
	// The portworx pod is told that its driver is missing once it has been
	// for undecidedGrace after the CSINode's creation
	// (TestDriverNotRegisteredWarnedAfterGrace): not waited for here.

	// Only the good volumes got VolumeAttachments.
	good := map[string]bool{
		framework.VolumeAttachmentName("vol-good-1", driver, node):            true,
		framework.VolumeAttachmentName("vol-no-object", noObjectDriver, node): true,
		framework.VolumeAttachmentName("vol-good-2", driver, node):            true,
	}
	framework.Consistently(t, quietPeriod, e.noVAFor(func(va *storagev1.VolumeAttachment) bool {
		return va.Spec.NodeName == node && !good[va.Name]
	}), "no VolumeAttachment on node %s but those of the good volumes", node)
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Status.VolumesAttached) != len(good) {
		t.Errorf("node.status.volumesAttached = %v, want the %d good volumes only", n.Status.VolumesAttached, len(good))
	}
	for _, pod := range []string{"unbound", "mismatched", "nfs", "good"} {
		warnings, err := e.warnings(pod)
		if err != nil {
			t.Fatal(err)
		}
		if len(warnings) != 0 {
			t.Errorf("pod %s: unexpected warnings %q", pod, warnings)
		}
	}
	assertRunning(t, ctrl)

	// The waiting claim gets bound: its volume attaches.
	unbound := framework.PVC(e.ns, "unbound", "")
	pvName := e.name("late-pv")
	claim, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, unbound.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.createPV(framework.PV(pvName, framework.CSISource(driver, "vol-late"), claim))
	claim.Spec.VolumeName = pvName
	if _, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Update(e.ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.setClaimBound(claim.Name)
	e.waitAttached(driver, "vol-late", node)
	assertRunning(t, ctrl)
}
