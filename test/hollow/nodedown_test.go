package hollow

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// outOfServiceTaint is the taint an operator puts on a node that is shut
// down for good (non-graceful node shutdown).
var outOfServiceTaint = v1.Taint{Key: v1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}

// forceDeletePod deletes a pod at once, as `kubectl delete --force` and the
// pod garbage collector do: its kubelet has not unmounted anything.
func (e *env) forceDeletePod(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		e.t.Fatalf("force delete pod %s/%s: %v", e.ns, name, err)
	}
}

// TestForceDeleteWhileKubeletDown: a pod force-deleted while its kubelet is
// stopped. The node still reports the volume in use (kubelet has not
// unmounted it), so nothing detaches while the kubelet is down; once it is
// back, kubelet unmounts the orphaned volume, drops it from volumesInUse,
// and the volume is detached.
func TestForceDeleteWhileKubeletDown(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "forcedown", 1)
		node := e.node(0)
		v := e.createVolume("data")
		start := time.Now()
		e.createPod("app", node, v.claim)
		e.waitSteps("pod created", start, nil, e.vaAttached(v, node), e.listedAttached(v, node, true), e.podRunning("app"))

		if err := e.nodes[0].StopKubelet(); err != nil {
			t.Fatal(err)
		}
		e.forceDeletePod("app")
		held := e.vaHeld(v, node)
		framework.Consistently(t, settle, held, "%s attached to %s while its kubelet is down and still reports it in use", v.name(), node)

		start = time.Now()
		if err := e.nodes[0].StartKubelet(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.waitSteps("kubelet back", start, nil,
			e.listedInUse(v, node, false),
			e.listedAttached(v, node, false),
			e.vaGone(v, node),
		)
		e.checkKubeletLogs()
	})
}

// TestOutOfServiceNode: a node shut down for good. Its kubelet is stopped,
// the node goes NotReady (the test writes the Ready condition Unknown, as
// the node lifecycle controller does), the operator taints it out of
// service and the pod is force-deleted (as the pod garbage collector does
// on such a node): the volume, still in the node's volumesInUse, is
// detached at once, not after the 6 minutes of max wait for unmount, and a
// new pod on another node runs with it.
func TestOutOfServiceNode(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "oos", 2)
		down, other := e.node(0), e.node(1)
		v := e.createVolume("data")
		start := time.Now()
		e.createPod("app", down, v.claim)
		e.waitSteps("pod created", start, nil, e.vaAttached(v, down), e.listedAttached(v, down, true), e.podRunning("app"))

		if err := e.nodes[0].StopKubelet(); err != nil {
			t.Fatal(err)
		}
		e.setNotReady(down)
		e.forceDeletePod("app")
		// Not out of service yet: the volume is in use on an unhealthy node
		// for less than the max wait for unmount.
		framework.Consistently(t, 5*time.Second, e.vaHeld(v, down), "%s attached to %s before the taint", v.name(), down)

		start = time.Now()
		e.taint(down, outOfServiceTaint)
		e.createPod("moved", other, v.claim)
		e.waitSteps("node out of service", start, nil,
			e.vaGone(v, down),
			e.listedAttached(v, down, false),
			e.vaAttached(v, other),
			e.listedAttached(v, other, true),
			e.podRunning("moved"),
		)
		// The stopped node's status is the last its kubelet wrote: the
		// volume still in use there. Names are checked on the live node.
		if err := e.nameMismatch(other); err != nil {
			t.Error(err)
		}
	})
}

// setNotReady writes the node's Ready condition Unknown, as the node
// lifecycle controller does when its kubelet stops posting status.
func (e *env) setNotReady(node string) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n = n.DeepCopy()
	for i, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			n.Status.Conditions[i].Status = v1.ConditionUnknown
			n.Status.Conditions[i].Reason = "NodeStatusUnknown"
			n.Status.Conditions[i].LastTransitionTime = metav1.Now()
		}
	}
	if _, err := e.client.CoreV1().Nodes().UpdateStatus(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("set node %s NotReady: %v", node, err)
	}
}

// taint adds a taint to the node.
func (e *env) taint(node string, taint v1.Taint) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n = n.DeepCopy()
	n.Spec.Taints = append(n.Spec.Taints, taint)
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(fmt.Errorf("taint node %s: %w", node, err))
	}
}
