package integration

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A node managed again: its kubelet attached volumes by itself while the
// node had no controller-managed-attach-detach annotation, mounted each as
// soon as it was attached, and lists a mount in node.status.volumesInUse
// only at its next status update. For reconciler.KubeletReportGrace after
// the controller reads the annotation back, a volume the node does not
// list in use counts as possibly mounted.

// setManaged puts the controller-managed-attach-detach annotation on the
// node, or removes it, as a kubelet restarted with or without controller
// attach/detach does.
func (e *env) setManaged(node string, on bool) {
	e.t.Helper()
	e.updateNode(node, func(n *v1.Node) {
		if !on {
			delete(n.Annotations, framework.ControllerManagedAnnotation)
			return
		}
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[framework.ControllerManagedAnnotation] = "true"
	})
}

// attachedWhileUnmanaged takes a managed node out of the controller's hands,
// and, as its kubelet attaching by itself does, attaches a volume for a pod
// there (the kubelet creates the VolumeAttachment, the external-attacher
// marks it attached) and mounts it, not reported in volumesInUse yet. The
// pod then goes, and the node is managed again: it returns the
// VolumeAttachment, and when the annotation was put back (before the
// write, so before the controller could read it).
func attachedWhileUnmanaged(e *env, x *explainer, driver string) (node, vol string, va *storagev1.VolumeAttachment, back time.Time) {
	e.t.Helper()
	node = e.createNode("node", true)
	pv := e.createCSIClaim("claim", driver, "vol-1")
	vol = framework.CSIVolumeName(driver, "vol-1")
	e.setManaged(node, false)
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node)
		return strings.Contains(got.Reason, "is not managed"), err
	}, "the controller read node %s unmanaged", node)
	e.createPod("pod", node, "claim")
	va = e.createAttachedVA(driver, "vol-1", pv.Name, node)
	if va == nil {
		e.t.Fatalf("VolumeAttachment of %s on the unmanaged node %s deleted", vol, node)
	}
	e.deletePod("pod")
	back = time.Now()
	e.setManaged(node, true)
	return node, vol, va, back
}

// The kubelet reports the mount a few seconds after the node is managed
// again: the volume is never detached, neither before the report nor while
// it lists the volume in use, past the grace; once it no longer does, the
// volume is detached.
func TestManagedAgainNodeKeepsMountItReportsLate(t *testing.T) {
	const reportAfter = 10 * time.Second
	e := newEnv(t, "managed-again")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startController(x.configure)
	node, vol, va, back := attachedWhileUnmanaged(e, x, driver)
	vw := e.watchVA(va)

	framework.Consistently(t, reportAfter, vw.intact,
		"the volume, maybe mounted, to stay attached to node %s managed again, before its kubelet's next status update", node)
	got, err := x.explain(vol, node)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.Reason, "is managed again since") {
		t.Errorf("explain %s on node %s: %q, want it to say the node is managed again", vol, node, got.Reason)
	}
	e.setVolumesInUse(node, vol)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node)
		return strings.Contains(got.Reason, "volumesInUse"), err
	}, "the controller read that node %s lists %s in use", node, vol)
	// Past the grace, what the node lists in use is all that holds it.
	framework.Consistently(t, time.Until(back.Add(reconciler.KubeletReportGrace+5*time.Second)), vw.intact,
		"the volume node %s lists in use to stay attached past the grace", node)
	vw.close()

	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-1", node)
}

// Nothing is mounted: the node managed again never lists the volume in use.
// It is detached once the grace has passed since the controller read the
// annotation back, not before.
func TestManagedAgainNodeUnmountedVolumeDetachedAfterGrace(t *testing.T) {
	const grace = reconciler.KubeletReportGrace
	e := newEnv(t, "managed-again-unused")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startController(x.configure)
	node, _, va, back := attachedWhileUnmanaged(e, x, driver)
	vw := e.watchVA(va)

	// The controller read the annotation at back or later: a detach before
	// back plus the grace came too early. A margin of a few seconds for the
	// checks, on a loaded machine.
	framework.Consistently(t, time.Until(back.Add(grace-3*time.Second)), vw.intact,
		"the volume to stay attached to node %s, managed again, for the grace", node)
	vw.close()
	e.waitDetached(driver, "vol-1", node)
	elapsed := time.Since(back)
	t.Logf("Detached %s after the annotation was put back (grace %s)", elapsed.Round(100*time.Millisecond), grace)
	if elapsed < grace {
		t.Errorf("volume detached %s after node %s was managed again, before the grace (%s)", elapsed, node, grace)
	}
	if limit := grace + 15*time.Second; elapsed > limit {
		t.Errorf("volume detached %s after node %s was managed again, more than %s", elapsed, node, limit)
	}
}

// A volume mounted on a NotReady node whose pod is gone waits for the max
// wait for unmount. The node is taken out of the controller's hands for a
// while, and put back: what its pods did meanwhile was not counted, so the
// max wait counts again from when the node is managed again, not from the
// pod's departure.
func TestManagedAgainNodeGetsTheMaxWaitAfresh(t *testing.T) {
	const (
		maxWait   = 15 * time.Second
		unmanaged = 10 * time.Second
	)
	e := newEnv(t, "managed-again-maxwait")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startController(func(o *app.Options) {
		x.configure(o)
		o.MaxWaitForUnmount = maxWait
	})
	node, va, deleted := mountedOnDeadNode(e, driver)
	vol := framework.CSIVolumeName(driver, "vol-1")
	vw := e.watchVA(va)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node)
		return strings.Contains(got.Reason, "forced detach in"), err
	}, "the controller counts the max wait for unmount of %s on node %s", vol, node)

	e.setManaged(node, false)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, node)
		return strings.Contains(got.Reason, "is not managed"), err
	}, "the controller read node %s unmanaged", node)
	framework.Consistently(t, time.Until(deleted.Add(unmanaged)), vw.intact, "the volume to stay attached to node %s, not managed", node)
	back := time.Now()
	e.setManaged(node, true)
	framework.Consistently(t, time.Until(back.Add(maxWait-3*time.Second)), vw.intact,
		"the volume, mounted on NotReady node %s, to stay attached for the max wait for unmount from when the node is managed again", node)
	vw.close()
	e.waitDetached(driver, "vol-1", node)
	elapsed := time.Since(back)
	t.Logf("Detached %s after the node was managed again, %s after its pod was deleted (max wait for unmount %s)",
		elapsed.Round(100*time.Millisecond), time.Since(deleted).Round(100*time.Millisecond), maxWait)
	if elapsed < maxWait {
		t.Errorf("volume detached %s after node %s was managed again, before the max wait for unmount (%s)", elapsed, node, maxWait)
	}
}
