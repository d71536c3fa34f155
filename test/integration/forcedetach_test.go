package integration

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// mountedOnDeadNode attaches a volume for a pod on a new node, marks it
// mounted, makes the node NotReady and deletes the pod. It returns the node
// name, the VolumeAttachment and when the pod was deleted.
func mountedOnDeadNode(e *env, driver string) (string, *storagev1.VolumeAttachment, time.Time) {
	e.t.Helper()
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	// In use from before the attach, as kubelet reports it: the controller
	// has long seen it when the pod goes.
	e.setVolumesInUse(node, framework.CSIVolumeName(driver, "vol-1"))
	e.createPod("pod", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)
	e.setNodeReady(node, false)
	deleted := time.Now()
	e.deletePod("pod")
	return node, va, deleted
}

// The out-of-service taint on a NotReady node detaches a mounted volume at
// once, long before the max wait for unmount.
func TestOutOfServiceForcesDetach(t *testing.T) {
	e := newEnv(t, "oos")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	// The upstream default: a detach within the test's deadline can only
	// come from the taint.
	e.startController(func(o *app.Options) { o.MaxWaitForUnmount = 6 * time.Minute })

	node, _, _ := mountedOnDeadNode(e, driver)
	e.updateNode(node, func(n *v1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{
			Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute,
		})
	})
	e.waitDetached(driver, "vol-1", node)
}

// A volume still mounted on a NotReady node is detached once the max wait
// for unmount has passed since the pod went away, and not before.
func TestForcedDetachAfterMaxWait(t *testing.T) {
	const maxWait = 5 * time.Second
	e := newEnv(t, "maxwait")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.MaxWaitForUnmount = maxWait })

	node, _, deleted := mountedOnDeadNode(e, driver)
	e.waitDetached(driver, "vol-1", node)
	if elapsed := time.Since(deleted); elapsed < maxWait {
		t.Errorf("mounted volume detached %s after its pod was deleted, before the max wait for unmount (%s)", elapsed, maxWait)
	}
}

// With forced detach on timeout disabled, a volume mounted on a NotReady
// node stays attached well past the max wait for unmount, until it is
// unmounted.
func TestNoForcedDetachWhenDisabled(t *testing.T) {
	const maxWait = 2 * time.Second
	e := newEnv(t, "noforce")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) {
		o.MaxWaitForUnmount = maxWait
		o.DisableForceDetachOnTimeout = true
	})

	node, va, _ := mountedOnDeadNode(e, driver)
	vw := e.watchVA(va)
	framework.Consistently(t, 3*maxWait, vw.intact, "the mounted volume to stay attached (three times the max wait for unmount)")

	// Unmounted: now it may go, node NotReady or not.
	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-1", node)
}

// With --max-wait-for-unmount-deleted-node=0, a volume still mounted on a
// node whose Node object is deleted is detached at once, while the max wait
// for unmount (6m) still applies to nodes that exist.
func TestDeletedNodeDetachedAtOnce(t *testing.T) {
	e := newEnv(t, "delnode")
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) {
		o.MaxWaitForUnmount = 6 * time.Minute
		o.MaxWaitForUnmountDeletedNode = new(time.Duration)
	})

	node, va, _ := mountedOnDeadNode(e, driver)
	// NotReady and mounted: the max wait for unmount holds it.
	vw := e.watchVA(va)
	framework.Consistently(t, quietPeriod, vw.intact, "the volume mounted on a NotReady node to stay attached")
	vw.close()

	if err := e.client.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node %s: %v", node, err)
	}
	deleted := time.Now()
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, exists, err := e.getVA(va.Name)
		return !exists, err
	}, "VolumeAttachment %s deleted once node %s is deleted", va.Name, node)
	t.Logf("Detached %s after the Node object was deleted", time.Since(deleted))
}
