package migration

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	decisionsMetric = "attachdetach_controller_mechanism_decisions_total"
	waitingMetric   = "attachdetach_controller_volumes_waiting_for_node_info"
	operationCount  = "storage_operation_duration_seconds_count"
	totalVolumes    = "attachdetach_controller_total_volumes"
)

// A PV of a migrated in-tree plugin is attached through its CSI driver: a
// VolumeAttachment named after the translated handle, naming the PV.
func TestMigratedPV(t *testing.T) {
	const (
		ns   = "mig-pv"
		node = "mig-pv-node"
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, node)
	createMigratedCSINode(ctx, t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t)

	pv := createBoundPV(t, ns, "claim", ebsSource("vol-abc"))
	createPod(t, ns, "pod", node, framework.PVCVolumes("claim")...)

	va := waitAttachedVA(t, framework.VolumeAttachmentName("vol-abc", ebsDriver, node))
	if va.Spec.Attacher != ebsDriver {
		t.Errorf("spec.attacher = %q, want %q", va.Spec.Attacher, ebsDriver)
	}
	if va.Spec.NodeName != node {
		t.Errorf("spec.nodeName = %q, want %q", va.Spec.NodeName, node)
	}
	if src := va.Spec.Source; src.PersistentVolumeName == nil || *src.PersistentVolumeName != pv.Name || src.InlineVolumeSpec != nil {
		t.Errorf("spec.source = %+v, want persistentVolumeName %s only", src, pv.Name)
	}
	attached := waitListed(t, node, framework.CSIVolumeName(ebsDriver, "vol-abc"), true)
	if listed(attached, ebsPlugin+"/vol-abc") {
		t.Errorf("volumesAttached lists the in-tree name too: %v", attached)
	}
	for _, a := range attached {
		if a.DevicePath != "" {
			t.Errorf("volumesAttached[%s].devicePath = %q, want empty for CSI", a.Name, a.DevicePath)
		}
	}
	if names, err := vasOfNode(ctx, node); err != nil || len(names) != 1 {
		t.Errorf("VolumeAttachments of %s = %v (err %v), want exactly %s", node, names, err, va.Name)
	}

	// The attach is timed as a migrated operation of the CSI plugin, and the
	// decision is counted.
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		v, err := ctrl.metric(operationCount, map[string]string{
			"volume_plugin": "kubernetes.io/csi:" + ebsDriver, "operation_name": "volume_attach",
			"status": "success", "migrated": "true",
		})
		return v >= 1, err
	}, "storage_operation_duration_seconds sample with migrated=\"true\"")
	if v := ctrl.mustMetric(t, decisionsMetric, map[string]string{"plugin_name": ebsPlugin, "mechanism": "csi"}); v < 1 {
		t.Errorf("%s{plugin_name=%q,mechanism=\"csi\"} = %v, want >= 1", decisionsMetric, ebsPlugin, v)
	}
	if v := ctrl.mustMetric(t, decisionsMetric, map[string]string{"plugin_name": ebsPlugin, "mechanism": "in-tree"}); v != 0 {
		t.Errorf("%s{plugin_name=%q,mechanism=\"in-tree\"} = %v, want 0", decisionsMetric, ebsPlugin, v)
	}
	if v := ctrl.mustMetric(t, waitingMetric, nil); v != 0 {
		t.Errorf("%s = %v, want 0", waitingMetric, v)
	}
}

// An inline in-tree volume of a migrated plugin is attached with its
// translated spec inline in the VolumeAttachment.
func TestMigratedInlineVolume(t *testing.T) {
	const (
		ns     = "mig-inline"
		node   = "mig-inline-node"
		handle = "vol-0inline"
	)
	setup(t, ns)
	createNode(t, node)
	createMigratedCSINode(t.Context(), t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	startController(t)

	// The URL form of the volume ID: the handle is what translation makes of it.
	createPod(t, ns, "pod", node, inlineEBS("disk", "aws://us-east-1a/"+handle))

	va := waitAttachedVA(t, framework.VolumeAttachmentName(handle, ebsDriver, node))
	src := va.Spec.Source
	if src.PersistentVolumeName != nil {
		t.Errorf("spec.source.persistentVolumeName = %q, want none", *src.PersistentVolumeName)
	}
	switch {
	case src.InlineVolumeSpec == nil || src.InlineVolumeSpec.CSI == nil:
		t.Errorf("spec.source.inlineVolumeSpec = %+v, want a CSI source", src.InlineVolumeSpec)
	case src.InlineVolumeSpec.CSI.Driver != ebsDriver || src.InlineVolumeSpec.CSI.VolumeHandle != handle:
		t.Errorf("inlineVolumeSpec.csi = {driver %q, volumeHandle %q}, want {%q, %q}",
			src.InlineVolumeSpec.CSI.Driver, src.InlineVolumeSpec.CSI.VolumeHandle, ebsDriver, handle)
	}
	if va.Spec.Attacher != ebsDriver || va.Spec.NodeName != node {
		t.Errorf("spec = {attacher %q, nodeName %q}, want {%q, %q}", va.Spec.Attacher, va.Spec.NodeName, ebsDriver, node)
	}
	waitListed(t, node, framework.CSIVolumeName(ebsDriver, handle), true)
}

// A volume whose node has not said yet whether it migrated the plugin waits,
// with a warning on the pod, and is attached as soon as the CSINode appears.
func TestCSINodeCreatedLater(t *testing.T) {
	const (
		ns     = "mig-late"
		node   = "mig-late-node"
		handle = "vol-late"
		delay  = 20 * time.Second
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t)

	createBoundPV(t, ns, "claim", ebsSource(handle))
	createPod(t, ns, "pod", node, framework.PVCVolumes("claim")...)
	podCreated := time.Now()

	// While it waits: a warning naming the missing CSINode, the waiting
	// gauge at 1, and no VolumeAttachment.
	msg := waitPodEvent(t, ns, "pod", v1.EventTypeWarning, "CSINode", node)
	t.Logf("Warning while waiting: %s", msg)
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		v, err := ctrl.metric(waitingMetric, nil)
		return v == 1, err
	}, "%s to be 1", waitingMetric)
	framework.Consistently(t, delay-time.Since(podCreated), func() error {
		names, err := vasOfNode(ctx, node)
		switch {
		case err != nil:
			return err
		case len(names) != 0:
			return fmt.Errorf("VolumeAttachments %v created before node %s has a CSINode", names, node)
		}
		if v, err := ctrl.metric(waitingMetric, nil); err != nil || v != 1 {
			return fmt.Errorf("%s = %v (err %v), want 1 while waiting", waitingMetric, v, err)
		}
		return nil
	}, "no VolumeAttachment without CSINode")
	if v := ctrl.mustMetric(t, decisionsMetric, map[string]string{"plugin_name": ebsPlugin, "mechanism": "pending"}); v < 1 {
		t.Errorf("%s{mechanism=\"pending\"} = %v, want >= 1", decisionsMetric, v)
	}

	createMigratedCSINode(ctx, t, node)
	created := time.Now()
	name := framework.VolumeAttachmentName(handle, ebsDriver, node)
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		va, err := getVA(ctx, name)
		return va != nil, err
	}, "VolumeAttachment %s after the CSINode was created", name)
	if latency := time.Since(created); latency >= 2*time.Second {
		t.Errorf("VolumeAttachment appeared %s after the CSINode was created, want < 2s", latency)
	} else {
		t.Logf("VolumeAttachment appeared %s after the CSINode was created", latency)
	}
	waitAttachedVA(t, name)
	waitListed(t, node, framework.CSIVolumeName(ebsDriver, handle), true)
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		v, err := ctrl.metric(waitingMetric, nil)
		return v == 0, err
	}, "%s to be 0 once decided", waitingMetric)
	if v := ctrl.mustMetric(t, decisionsMetric, map[string]string{"plugin_name": ebsPlugin, "mechanism": "csi"}); v < 1 {
		t.Errorf("%s{mechanism=\"csi\"} = %v, want >= 1", decisionsMetric, v)
	}
}

// Without a CSINode, the CSINodeInfo decides: "csi" attaches through the
// driver; "in-tree" through the in-tree plugin, which this build lacks.
func TestCSINodeInfo(t *testing.T) {
	const (
		ns         = "mig-info"
		csiNode    = "mig-info-csi"
		inTreeNode = "mig-info-intree"
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, csiNode)
	createNode(t, inTreeNode)
	// Status first, pods second: a CSINodeInfo without status says the
	// driver is not there, which means in-tree.
	createCSINodeInfo(t, csiNode, true, "csi")
	createCSINodeInfo(t, inTreeNode, true, "in-tree")
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t)

	createBoundPV(t, ns, "csi-claim", ebsSource("vol-info-csi"))
	createBoundPV(t, ns, "intree-claim", ebsSource("vol-info-intree"))
	createPod(t, ns, "csi-pod", csiNode, framework.PVCVolumes("csi-claim")...)
	createPod(t, ns, "intree-pod", inTreeNode, framework.PVCVolumes("intree-claim")...)

	va := waitAttachedVA(t, framework.VolumeAttachmentName("vol-info-csi", ebsDriver, csiNode))
	if va.Spec.Attacher != ebsDriver {
		t.Errorf("spec.attacher = %q, want %q", va.Spec.Attacher, ebsDriver)
	}
	waitListed(t, csiNode, framework.CSIVolumeName(ebsDriver, "vol-info-csi"), true)

	msg := waitPodEvent(t, ns, "intree-pod", v1.EventTypeWarning, ebsPlugin, inTreeNode, "no attacher")
	t.Logf("Warning on the in-tree node: %s", msg)
	framework.Consistently(t, 2*time.Second, func() error {
		names, err := vasOfNode(ctx, inTreeNode)
		if err != nil {
			return err
		}
		if len(names) != 0 {
			return fmt.Errorf("VolumeAttachments %v created for a node whose CSINodeInfo says in-tree", names)
		}
		attached, err := volumesAttached(ctx, inTreeNode)
		if err != nil {
			return err
		}
		if len(attached) != 0 {
			return fmt.Errorf("volumesAttached = %v, want none: nothing can attach it", attached)
		}
		return nil
	}, "nothing attached on the in-tree node")
	if msg, err := podEvent(ctx, ns, "csi-pod", v1.EventTypeWarning); err != nil || msg != "" {
		t.Errorf("Warning on the pod of the CSI node: %q (err %v), want none", msg, err)
	}
	if v := ctrl.mustMetric(t, decisionsMetric, map[string]string{"plugin_name": ebsPlugin, "mechanism": "in-tree"}); v < 1 {
		t.Errorf("%s{mechanism=\"in-tree\"} = %v, want >= 1", decisionsMetric, v)
	}
}

// iSCSI is never migrated: on a node without migration it is attached the
// in-tree way, which only records it in node.status.
func TestISCSINotMigrated(t *testing.T) {
	const (
		ns     = "mig-iscsi"
		node   = "mig-iscsi-node"
		portal = "10.0.0.5:3260"
		iqn    = "iqn.2001-04.com.example:storage"
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, node)
	// A CSINode, with a driver but no migrated plugin.
	if _, err := framework.CreateCSINode(ctx, cluster.Client, node,
		[]storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-"+node)}); err != nil {
		t.Fatal(err)
	}
	startController(t)

	createBoundPV(t, ns, "claim", v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{
		TargetPortal: portal, IQN: iqn, Lun: 0,
	}})
	createPod(t, ns, "pod", node, framework.PVCVolumes("claim")...)

	want := fmt.Sprintf("kubernetes.io/iscsi/%s:%s:%d", portal, iqn, 0)
	waitListed(t, node, want, true)
	framework.Consistently(t, time.Second, func() error {
		names, err := vasOfNode(ctx, node)
		if err == nil && len(names) != 0 {
			err = fmt.Errorf("VolumeAttachments %v created for an iSCSI volume", names)
		}
		return err
	}, "no VolumeAttachment for iSCSI")
}

// An attached migrated volume stays attached while its node's CSINode is
// missing (kubelet re-registering), across a controller restart, and after
// the CSINode is back.
func TestAttachedKeptWithoutCSINode(t *testing.T) {
	const (
		ns   = "mig-keep"
		node = "mig-keep-node"
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, node)
	createMigratedCSINode(ctx, t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t)

	// Two volumes: one mounted (in volumesInUse), one not, so that the
	// in-use rule alone can't be what keeps them attached.
	handles := []string{"vol-keep-inuse", "vol-keep-idle"}
	createBoundPV(t, ns, "inuse", ebsSource(handles[0]))
	createBoundPV(t, ns, "idle", ebsSource(handles[1]))
	createPod(t, ns, "pod", node, framework.PVCVolumes("inuse", "idle")...)

	uids := map[string]types.UID{}
	var names []string
	for _, h := range handles {
		name := framework.VolumeAttachmentName(h, ebsDriver, node)
		uids[name] = waitAttachedVA(t, name).UID
		names = append(names, name)
		waitListed(t, node, framework.CSIVolumeName(ebsDriver, h), true)
	}
	if err := framework.SetVolumesInUse(ctx, cluster.Client, node, framework.CSIVolumeName(ebsDriver, handles[0])); err != nil {
		t.Fatal(err)
	}

	stillAttached := func() error {
		for _, name := range names {
			va, err := getVA(ctx, name)
			switch {
			case err != nil:
				return err
			case va == nil:
				return fmt.Errorf("VolumeAttachment %s deleted", name)
			case va.UID != uids[name]:
				return fmt.Errorf("VolumeAttachment %s recreated (uid %s, was %s)", name, va.UID, uids[name])
			case va.DeletionTimestamp != nil:
				return fmt.Errorf("VolumeAttachment %s is being deleted", name)
			}
		}
		return attachedExactly(ctx, node, framework.CSIVolumeName(ebsDriver, handles[0]), framework.CSIVolumeName(ebsDriver, handles[1]))
	}
	waitWaiting := func(c *controller, n float64) {
		t.Helper()
		framework.Eventually(t, 10*time.Second, func() (bool, error) {
			v, err := c.metric(waitingMetric, nil)
			return v == n, err
		}, "%s to be %v", waitingMetric, n)
	}

	if err := cluster.Client.StorageV1().CSINodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The controller sees the deletion within milliseconds; the window is
	// what a detach would need many times over.
	framework.Consistently(t, 4*time.Second, stillAttached, "the volumes to stay attached without CSINode")
	// Both volumes wait for the node to say again how it attaches them.
	waitWaiting(ctrl, 2)

	ctrl = ctrl.restart(t)
	framework.Consistently(t, 4*time.Second, stillAttached, "the volumes to stay attached without CSINode after a restart")
	waitWaiting(ctrl, 2)

	createMigratedCSINode(ctx, t, node)
	waitWaiting(ctrl, 0)
	framework.Consistently(t, 2*time.Second, stillAttached, "the volumes to stay attached once the CSINode is back")
	for _, p := range []string{"inuse", "idle"} {
		if msg, err := podEvent(ctx, ns, "pod", v1.EventTypeWarning, framework.PVName(ns, p)); err != nil || msg != "" {
			t.Errorf("Warning for volume %s: %q (err %v), want none: it was attached all along", p, msg, err)
		}
	}
}

// After a restart, VolumeAttachments of a migrated PV and of a migrated
// inline volume are recognized as the volumes pods want: nothing is detached
// until a pod goes away.
func TestRestartRecoversMigrated(t *testing.T) {
	const (
		ns           = "mig-restart"
		node         = "mig-restart-node"
		pvHandle     = "vol-restart-pv"
		inlineHandle = "vol-restart-inline"
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, node)
	createMigratedCSINode(ctx, t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t)

	createBoundPV(t, ns, "claim", ebsSource(pvHandle))
	createPod(t, ns, "pv-pod", node, framework.PVCVolumes("claim")...)
	createPod(t, ns, "inline-pod", node, inlineEBS("disk", inlineHandle))

	pvVA, inlineVA := framework.VolumeAttachmentName(pvHandle, ebsDriver, node), framework.VolumeAttachmentName(inlineHandle, ebsDriver, node)
	uids := map[string]types.UID{
		pvVA:     waitAttachedVA(t, pvVA).UID,
		inlineVA: waitAttachedVA(t, inlineVA).UID,
	}
	waitListed(t, node, framework.CSIVolumeName(ebsDriver, pvHandle), true)
	waitListed(t, node, framework.CSIVolumeName(ebsDriver, inlineHandle), true)

	// Neither volume is in volumesInUse: only knowing that the pods want
	// them keeps them attached.
	ctrl = ctrl.restart(t)
	csiPlugin := map[string]string{"plugin_name": "kubernetes.io/csi:" + ebsDriver}
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		actual, err := ctrl.metric(totalVolumes, merge(csiPlugin, "state", "actual_state_of_world"))
		if err != nil {
			return false, err
		}
		desired, err := ctrl.metric(totalVolumes, merge(csiPlugin, "state", "desired_state_of_world"))
		return actual >= 2 && desired >= 2, err
	}, "restarted controller to count both volumes desired and attached")
	unchanged := func(names ...string) func() error {
		return func() error {
			for _, name := range names {
				va, err := getVA(ctx, name)
				switch {
				case err != nil:
					return err
				case va == nil || va.UID != uids[name] || va.DeletionTimestamp != nil:
					return fmt.Errorf("VolumeAttachment %s deleted or recreated: %+v", name, va)
				}
			}
			return attachedExactly(ctx, node, framework.CSIVolumeName(ebsDriver, pvHandle), framework.CSIVolumeName(ebsDriver, inlineHandle))
		}
	}
	framework.Consistently(t, 4*time.Second, unchanged(pvVA, inlineVA), "nothing detached after a restart")

	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "inline-pod", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		va, err := getVA(ctx, inlineVA)
		return va == nil, err
	}, "VolumeAttachment %s of the deleted inline pod to be deleted", inlineVA)
	attached := waitListed(t, node, framework.CSIVolumeName(ebsDriver, inlineHandle), false)
	if !listed(attached, framework.CSIVolumeName(ebsDriver, pvHandle)) {
		t.Errorf("volumesAttached = %v, want %s still listed", attached, framework.CSIVolumeName(ebsDriver, pvHandle))
	}
	if va, err := getVA(ctx, pvVA); err != nil || va == nil || va.UID != uids[pvVA] {
		t.Errorf("VolumeAttachment %s of the remaining pod: %+v (err %v), want it unchanged", pvVA, va, err)
	}
}

func merge(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for mk, mv := range m {
		out[mk] = mv
	}
	return out
}
