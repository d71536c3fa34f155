package integration

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// holdFinalizer keeps a deleted VolumeAttachment in place, as an
// external-attacher does while ControllerUnpublish runs.
const holdFinalizer = "handoff.test.example.com/hold"

// A graceful stop hands the volumes over: the controller waits for the
// detach under way to finish, starts no new one (a pod deleted meanwhile
// keeps its VolumeAttachment and its node status entry, for the next
// controller to detach), and returns once nothing is left in between.
func TestHandoffOnGracefulStop(t *testing.T) {
	e := newEnv(t, "handoff")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.startAttacher(driver, "")
	first := e.startController(func(o *app.Options) { o.HandoffTimeout = time.Minute })

	e.createCSIClaim("busy", driver, "vol-busy")
	e.createPod("pod-busy", node, "busy")
	e.createCSIClaim("kept", driver, "vol-kept")
	e.createPod("pod-kept", node, "kept")
	busy := e.waitAttached(driver, "vol-busy", node)
	kept := e.waitAttached(driver, "vol-kept", node)
	keptName := framework.CSIVolumeName(driver, "vol-kept")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, listed, err := e.attachedInStatus(node, keptName)
		return listed, err
	}, "%s listed in node status", keptName)

	// The detach of vol-busy starts and stays under way.
	e.patchFinalizers(busy.Name, []string{holdFinalizer})
	e.deletePod("pod-busy")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		va, ok, err := e.getVA(busy.Name)
		return ok && va.DeletionTimestamp != nil, err
	}, "detach of vol-busy started")

	kw := e.watchVA(kept)
	nw := e.watchNode(node)
	stopped := make(chan struct{})
	stopStart := time.Now()
	go func() {
		defer close(stopped)
		if err := first.Stop(stopTimeout); err != nil {
			t.Error(err)
		}
	}()
	// Asked to stop, it still waits for the detach under way. A pod deleted
	// now keeps its volume attached and listed.
	e.deletePod("pod-kept")
	framework.Consistently(t, 3*time.Second, func() error {
		if !first.Running() {
			return fmt.Errorf("Run returned with a detach still under way")
		}
		if err := kw.intact(); err != nil {
			return err
		}
		if m := nw.missing(keptName); len(m) != 0 {
			return fmt.Errorf("node status stopped listing %s during the handoff: %v", keptName, m)
		}
		return nil
	}, "handoff waits for the detach under way, starts none")

	// The detach completes: the handoff is done.
	e.patchFinalizers(busy.Name, nil)
	released := time.Now()
	select {
	case <-stopped:
	case <-time.After(stopTimeout):
		t.Fatalf("Run did not return %s after the detach under way completed", stopTimeout)
	}
	t.Logf("stopped %s after the detach completed (%s after the stop was asked)",
		time.Since(released).Round(time.Millisecond), time.Since(stopStart).Round(time.Millisecond))
	if err := kw.intact(); err != nil {
		t.Errorf("after the handoff: %v", err)
	}
	if m := nw.missing(keptName); len(m) != 0 {
		t.Errorf("after the handoff, node status does not list %s: %v", keptName, m)
	}

	// The next controller detaches what was left to it.
	e.startController(nil)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, ok, err := e.getVA(kept.Name)
		return !ok, err
	}, "the next controller detaches vol-kept")
}

// The handoff is bounded: an attach that never completes does not hold the
// stop longer than --handoff-timeout.
func TestHandoffTimeout(t *testing.T) {
	e := newEnv(t, "handoff-timeout")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.startAttacher(driver, "fail-")
	const timeout = 3 * time.Second
	c := e.startController(func(o *app.Options) { o.HandoffTimeout = timeout })
	e.createCSIClaim("failing", driver, "fail-1")
	e.createPod("pod-failing", node, "failing")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		va, ok, err := e.getVA(framework.VolumeAttachmentName("fail-1", driver, node))
		return ok && va.Status.AttachError != nil, err
	}, "attach of fail-1 failing")
	start := time.Now()
	if err := c.Stop(stopTimeout); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < timeout || took > timeout+10*time.Second {
		t.Errorf("stop took %s, want about the handoff timeout %s", took, timeout)
	}
}

func (e *env) patchFinalizers(va string, finalizers []string) {
	e.t.Helper()
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": finalizers}})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Patch(e.ctx, va, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("set finalizers of VolumeAttachment %s: %v", va, err)
	}
}
