package hollow

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// createBoundClaim creates claim (its spec.volumeName set to a PV of its
// own, framework.PVName) and that PV with src, bound to each other, as
// framework.CreateBoundPVC does for claims it builds itself.
func (e *env) createBoundClaim(claim *v1.PersistentVolumeClaim, src v1.PersistentVolumeSource) csiVolume {
	e.t.Helper()
	claim.Spec.VolumeName = framework.PVName(e.ns, claim.Name)
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, claim, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create PVC %s/%s: %v", e.ns, claim.Name, err)
	}
	pv := framework.PV(claim.Spec.VolumeName, src, pvc, pvc.Spec.AccessModes...)
	pv.Spec.VolumeMode = pvc.Spec.VolumeMode
	if pv, err = e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create PV %s: %v", claim.Spec.VolumeName, err)
	}
	pv.Status.Phase = v1.VolumeBound
	if _, err = e.client.CoreV1().PersistentVolumes().UpdateStatus(e.ctx, pv, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("set PV %s bound: %v", pv.Name, err)
	}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: pv.Spec.AccessModes, Capacity: pv.Spec.Capacity}
	if _, err = e.client.CoreV1().PersistentVolumeClaims(e.ns).UpdateStatus(e.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("set PVC %s/%s bound: %v", e.ns, pvc.Name, err)
	}
	return csiVolume{claim: pvc.Name, pv: pv.Name, driver: src.CSI.Driver, handle: src.CSI.VolumeHandle}
}

// TestBlockVolume: a raw block volume (volumeMode Block, a volumeDevice in
// the container): attached and listed under the same unique name as a
// filesystem volume; kubelet confirms the attach ("Controller attach
// succeeded") and its CSI plugin's WaitForAttach succeeds. The map itself
// then fails: the hollow node's block path handler bind-mounts for real
// (mount point is not a directory), so the pod does not run. Deleted, the
// pod goes and the volume is detached.
func TestBlockVolume(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "block", 1)
		node := e.node(0)
		claim := framework.PVC(e.ns, "raw", "")
		claim.Spec.VolumeMode = new(v1.PersistentVolumeBlock)
		v := e.createBoundClaim(claim, framework.CSISource(stack.MockDriver, e.ns+"-raw"))

		pod := framework.Pod(e.ns, "app", node, framework.PVCVolumes(v.claim)...)
		c := &pod.Spec.Containers[0]
		c.VolumeDevices = []v1.VolumeDevice{{Name: c.VolumeMounts[0].Name, DevicePath: "/dev/xvda"}}
		c.VolumeMounts = nil
		start := time.Now()
		if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.waitSteps("pod created", start, nil,
			e.listedInUse(v, node, true), e.vaAttached(v, node), e.listedAttached(v, node, true),
			e.kubeletConfirmed(0, v.name()), e.kubeletLogged(0, "MapVolume.WaitForAttach succeeded", v.pv))
		e.checkNames()

		start = time.Now()
		e.deletePod("app")
		e.waitSteps("pod deleted", start, nil, e.podGone("app"), e.listedInUse(v, node, false), e.vaGone(v, node))
	})
}

// kubeletLogged: node i's kubelet logged a line holding both what and about.
func (e *env) kubeletLogged(i int, what, about string) step {
	return step{"kubelet of " + e.node(i) + " logs " + what + " for " + about, func() (bool, error) {
		log, err := e.nodes[i].KubeletLog()
		if err != nil {
			return false, err
		}
		for line := range strings.Lines(log) {
			if strings.Contains(line, what) && strings.Contains(line, about) {
				return true, nil
			}
		}
		return false, nil
	}}
}

// TestGenericEphemeralVolume: a pod with a generic ephemeral volume. The
// test makes the claim "<pod>-<volume>", owned by the pod, as the
// ephemeral volume controller would, a moment after the pod: the volume is
// attached once the claim is bound, kubelet (which checks the claim's
// owner) mounts it, the pod runs; deleted, it is detached.
func TestGenericEphemeralVolume(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "ephemeral", 1)
		node := e.node(0)
		spec := v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
			StorageClassName: new(""),
		}
		start := time.Now()
		pod, err := framework.CreatePodWithVolumes(e.ctx, e.client, e.ns, "app", node, v1.Volume{
			Name:         "scratch",
			VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: spec}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		claim := framework.PVC(e.ns, "app-scratch", "")
		claim.Spec.Resources = spec.Resources
		claim.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
			Controller: new(true), BlockOwnerDeletion: new(true),
		}}
		v := e.createBoundClaim(claim, framework.CSISource(stack.MockDriver, e.ns+"-app-scratch"))
		e.waitSteps("pod created, then its claim", start, nil,
			e.vaAttached(v, node), e.listedAttached(v, node, true), e.listedInUse(v, node, true), e.podRunning("app"))
		e.checkNames()
		e.checkKubeletLogs()

		start = time.Now()
		e.deletePod("app")
		e.waitSteps("pod deleted", start, nil, e.podGone("app"), e.vaGone(v, node), e.listedAttached(v, node, false))
	})
}

const (
	// portworxPlugin is the in-tree plugin kubelet lists as migrated to
	// portworxDriver.
	portworxPlugin = "kubernetes.io/portworx-volume"
	// portworxDriver is the CSI driver its volumes migrate to.
	portworxDriver = "pxd.portworx.com"
)

// TestMigratedPortworx: an in-tree Portworx PV on a node whose kubelet
// registered pxd.portworx.com and lists kubernetes.io/portworx-volume as
// migrated: attached through CSI under the CSI name, the pod runs.
func TestMigratedPortworx(t *testing.T) {
	fullSet(t)
	if err := st.AddDriver(t.Context(), portworxDriver); err != nil {
		t.Fatal(err)
	}
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "pxd", 1, func(_ int, o *stack.HollowNodeOptions) {
			o.Drivers = append(append(o.Drivers, st.Drivers...), portworxDriver)
		})
		node := e.node(0)
		csiNode, err := e.client.StorageV1().CSINodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(csiNode.Annotations[migratedPluginsAnnotation], portworxPlugin) {
			t.Fatalf("CSINode %s written by kubelet: %s = %q, want %s in it", node, migratedPluginsAnnotation, csiNode.Annotations[migratedPluginsAnnotation], portworxPlugin)
		}
		id := "pxd-" + e.ns
		src := v1.PersistentVolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: id, FSType: "ext4"}}
		pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, "legacy", src)
		if err != nil {
			t.Fatal(err)
		}
		v := csiVolume{claim: "legacy", pv: pv.Name, driver: portworxDriver, handle: id}
		start := time.Now()
		e.createPod("app", node, v.claim)
		e.waitSteps("pod created", start, nil,
			e.vaAttached(v, node), e.listedAttached(v, node, true), e.listedInUse(v, node, true), e.podRunning("app"))
		e.checkNames()
		e.checkKubeletLogs()
		start = time.Now()
		e.deletePod("app")
		e.waitSteps("pod deleted", start, nil, e.podGone("app"), e.vaGone(v, node))
	})
}
