package integration

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The controller's create of node-1's VolumeAttachment of a ReadWriteOnce
// volume is answered with a timeout before the API server has it, and
// carried out later (as a server that timed out while a slow admission
// webhook or etcd still held the write). Meanwhile node-1 stops being
// Ready with the volume in use, its pod goes, and a pod on node-2 wants
// the volume. The API shows no VolumeAttachment on node-1 then, which
// proves nothing: the create lands after. The volume never has
// VolumeAttachments on both nodes.
func TestCreateLandingAfterItsTimeoutNeverAttachesTwice(t *testing.T) {
	e := newEnv(t, "create-late")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startControllerVia(p, x.configure)
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	pv := e.createCSIClaim("claim", driver, "vol-1").Name
	vol := framework.CSIVolumeName(driver, "vol-1")
	name1 := volume.AttachmentName("vol-1", driver, node1)
	aw := e.watchAttachmentsOf(pv)
	late := p.landLater(isCall(http.MethodPost, "volumeattachments"), name1)

	e.setVolumesInUse(node1, vol)
	e.createPod("pod-1", node1, "claim")
	waitClosed(t, late.held, waitTimeout, "node-1's create answered with a timeout, held")
	e.setNodeReady(node1, false)
	e.deletePod("pod-1")
	e.createPod("pod-2", node2, "claim")
	// The controller has read all that: it holds node-1's attachment for
	// the max wait for unmount and node-2 waits, or it has attached the
	// volume to node-2.
	name2 := volume.AttachmentName("vol-1", driver, node2)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		if _, ok, err := e.getVA(name2); ok || err != nil {
			return ok, err
		}
		on1, err := x.explain(vol, node1)
		if err != nil {
			return false, err
		}
		on2, err := x.explain(vol, node2)
		return on1.Action == "wait" && on2.Desired && on2.Action == "blocked", err
	}, "the controller decided for pod-2 on %s", node2)
	late.release()
	waitClosed(t, late.landed, waitTimeout, "node-1's create carried out")
	if late.status >= 300 {
		t.Logf("node-1's create answered %d", late.status)
	}
	framework.Consistently(t, quietPeriod, aw.violations, "no two VolumeAttachments of the volume")
	if err := aw.violations(); err != nil {
		t.Error(err)
	}
	got, err := x.explain(vol, node1)
	t.Log(fmt.Sprintf("node-1: %s: %s", got.Action, got.Reason), err)
}
