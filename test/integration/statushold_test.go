package integration

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The volumes of a pod attach together, and kubelet mounts none before
// node.status lists it: one status write reports them all. The attacher
// confirms the five VolumeAttachments 50 ms apart; a controller writing each
// attach at once would write the node's status five times.
func TestNodeStatusOneWriteForAttachesTogether(t *testing.T) {
	e := newEnv(t, "statushold")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	var claims, names []string
	for i := range 5 {
		claim, handle := fmt.Sprintf("claim-%d", i), fmt.Sprintf("vol-%d", i)
		e.createCSIClaim(claim, driver, handle)
		claims = append(claims, claim)
		names = append(names, framework.CSIVolumeName(driver, handle))
	}
	e.startController(nil)
	e.createPod("pod", node, claims...)
	var attachments []string
	for i := range claims {
		va := e.waitVA(framework.VolumeAttachmentName(fmt.Sprintf("vol-%d", i), driver, node))
		attachments = append(attachments, va.Name)
	}
	nw := e.watchNode(node)
	for _, name := range attachments {
		e.markAttached(name)
		time.Sleep(50 * time.Millisecond)
	}
	for _, v := range names {
		e.waitListed(node, v)
	}
	writes := nw.listChanges()
	t.Logf("node.status.volumesAttached as written: %v", writes)
	// The five attaches span 200 ms, well within the second a write waits
	// for the attaches under way on its node; one write more is allowed for
	// a test process paused meanwhile.
	if len(writes) > 2 {
		t.Errorf("node status written %d times for five volumes attached together, want 1 (at most 2)", len(writes))
	}
}

// A write waits for the attaches under way only so long: a volume whose
// attacher never answers does not keep another one, attached, out of
// node.status.
func TestNodeStatusWriteWaitsForStuckAttachAtMostASecond(t *testing.T) {
	e := newEnv(t, "statusstuck")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("stuck", driver, "vol-stuck")
	e.createCSIClaim("ok", driver, "vol-ok")
	e.startController(nil)
	e.createPod("pod", node, "stuck", "ok")
	e.waitVA(framework.VolumeAttachmentName("vol-stuck", driver, node))
	ok := e.waitVA(framework.VolumeAttachmentName("vol-ok", driver, node))
	start := time.Now()
	e.markAttached(ok.Name)
	e.waitListed(node, framework.CSIVolumeName(driver, "vol-ok"))
	took := time.Since(start)
	t.Logf("listed %s after the attach was confirmed, the other attach still under way", took.Round(time.Millisecond))
	// The wait is a second; the rest is margin for a loaded machine.
	if took > 5*time.Second {
		t.Errorf("listed %s after its attach was confirmed, want about a second", took.Round(time.Millisecond))
	}
	if _, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-stuck")); err != nil || listed {
		t.Errorf("node status lists the volume whose attach was never confirmed (err %v)", err)
	}
}

// markAttached sets status.attached of the VolumeAttachment, as an
// external-attacher does.
func (e *env) markAttached(name string) {
	e.t.Helper()
	_, err := e.client.StorageV1().VolumeAttachments().Patch(e.ctx, name, types.MergePatchType,
		[]byte(`{"status":{"attached":true}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		e.t.Fatalf("mark VolumeAttachment %s attached: %v", name, err)
	}
}

// listChanges returns each volumesAttached list the node's versions held,
// from the first version on, once per change (names only).
func (nw *nodeWatch) listChanges() [][]string {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	var out [][]string
	var last []string
	for i, n := range nw.versions {
		var names []string
		for _, av := range n.Status.VolumesAttached {
			names = append(names, string(av.Name))
		}
		if i > 0 && !slices.Equal(names, last) {
			out = append(out, names)
		}
		last = names
	}
	return out
}
