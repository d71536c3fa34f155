package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// waitTimeout bounds every wait for the stack to act. An attach takes
	// well under a second here; the margin is for loaded CI machines.
	waitTimeout = 60 * time.Second
	// stopTimeout bounds a graceful stop of the controller.
	stopTimeout = 30 * time.Second
	// logTail is how much of each component's log a failed test shows.
	logTail = 6 * 1024
)

// env is one test's part of the stack: a namespace, simulated nodes, and a
// controller.
type env struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	ns     string
	nodes  []string

	kubelets   *stack.Process
	controller *stack.Controller
	// controllers are every controller the test started, for the logs.
	controllers []*stack.Controller
}

// newEnv creates a namespace, starts a kubeletsim for nodes nodes and a
// controller. migrated lists the in-tree plugins the nodes migrate to CSI.
func newEnv(t *testing.T, base string, nodes int, migrated ...string) *env {
	t.Helper()
	e := newEnvWithoutController(t, base, nodes, migrated...)
	e.startController()
	return e
}

// newEnvWithoutController is newEnv, the controller left to the test.
func newEnvWithoutController(t *testing.T, base string, nodes int, migrated ...string) *env {
	t.Helper()
	suffix := make([]byte, 2)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	prefix := base + "-" + hex.EncodeToString(suffix)
	e := &env{t: t, ctx: t.Context(), client: st.Cluster.Client, ns: prefix}
	t.Cleanup(e.cleanup)
	if _, err := framework.CreateNamespace(e.ctx, e.client, e.ns); err != nil {
		t.Fatal(err)
	}
	opts := stack.KubeletOptions{NodePrefix: prefix + "-node-", Nodes: nodes, MigratedPlugins: migrated,
		// kubelet's order of events (volumesInUse written by the status
		// loop only), in a fifth of its time (10 s).
		ExtraArgs: []string{"--node-status-update-frequency=2s"}}
	e.nodes = opts.NodeNames()
	var err error
	e.kubelets, err = st.StartKubelets(e.ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// startController starts a controller with extraArgs and waits until it is
// ready.
func (e *env) startController(extraArgs ...string) {
	e.t.Helper()
	c, err := st.StartController(e.ctx, extraArgs...)
	if c != nil {
		e.controllers = append(e.controllers, c)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	e.controller = c
}

// cleanup stops the test's processes, showing their logs, and the
// attachers', if the test failed. Objects stay: see the package doc.
func (e *env) cleanup() {
	if e.t.Failed() {
		var procs []*stack.Process
		for _, c := range e.controllers {
			procs = append(procs, c.Process)
		}
		if e.kubelets != nil {
			procs = append(procs, e.kubelets)
		}
		for _, p := range st.Processes() {
			if strings.HasPrefix(p.Name, "csi-attacher") {
				procs = append(procs, p)
			}
		}
		for _, p := range procs {
			e.t.Logf("--- last lines of %s:\n%s", p.Name, p.Tail(logTail))
		}
	}
	for _, c := range e.controllers {
		if err := c.Process.Stop(stack.StopGrace); err != nil {
			e.t.Error(err)
		}
	}
	if e.kubelets != nil {
		if err := e.kubelets.Stop(stack.StopGrace); err != nil {
			e.t.Error(err)
		}
	}
}

// csiVolume is a PVC bound to a CSI PV of the mock driver.
type csiVolume struct {
	claim  string
	pv     string
	driver string
	handle string
}

// name is the volume's unique name in node status.
func (v csiVolume) name() string { return framework.CSIVolumeName(v.driver, v.handle) }

// vaName is the name of the volume's VolumeAttachment on node.
func (v csiVolume) vaName(node string) string {
	return framework.VolumeAttachmentName(v.handle, v.driver, node)
}

// eventually is framework.Eventually with the timeout of the package.
func (e *env) eventually(cond func() (bool, error), format string, args ...any) {
	e.t.Helper()
	framework.Eventually(e.t, waitTimeout, cond, format, args...)
}

// createVolume creates claim bound to a mock CSI volume with access modes.
func (e *env) createVolume(claim string, modes ...v1.PersistentVolumeAccessMode) csiVolume {
	e.t.Helper()
	v := csiVolume{claim: claim, driver: stack.MockDriver, handle: e.ns + "-" + claim}
	pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, claim, framework.CSISource(v.driver, v.handle), modes...)
	if err != nil {
		e.t.Fatal(err)
	}
	v.pv = pv.Name
	return v
}

// createPod creates a pod on node using the claims.
func (e *env) createPod(name, node string, claims ...string) {
	e.t.Helper()
	if _, err := framework.CreatePod(e.ctx, e.client, e.ns, name, node, claims...); err != nil {
		e.t.Fatal(err)
	}
}

// deletePod deletes a pod as a user does, with a grace period: kubeletsim
// unmounts its volumes and then deletes it for good.
func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete pod %s/%s: %v", e.ns, name, err)
	}
}

// waitPodGone waits until kubeletsim has finished the pod's deletion.
func (e *env) waitPodGone(name string) {
	e.t.Helper()
	e.eventually(func() (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "pod %s/%s deleted by kubeletsim", e.ns, name)
}

// attachedBy says whether the real external-attacher of driver attached va:
// its finalizer and node ID annotation are there, and status.attached.
func attachedBy(va *storagev1.VolumeAttachment, driver string) bool {
	return va.Status.Attached &&
		slices.Contains(va.Finalizers, framework.AttacherFinalizer(driver)) &&
		va.Annotations[framework.NodeIDAnnotation] == driver
}

// waitAttached waits until v is attached to node by the external-attacher,
// listed in the node's volumesAttached, and mounted (volumesInUse), and
// returns the VolumeAttachment.
func (e *env) waitAttached(v csiVolume, node string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually(func() (bool, error) {
		var err error
		va, err = e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && attachedBy(va, v.driver), err
	}, "VolumeAttachment %s of %s on %s attached by csi-attacher", v.vaName(node), v.name(), node)
	if va.Spec.Attacher != v.driver || va.Spec.NodeName != node || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != v.pv {
		e.t.Fatalf("VolumeAttachment %s: spec %+v, want attacher %s, node %s, PV %s", va.Name, va.Spec, v.driver, node, v.pv)
	}
	e.eventually(func() (bool, error) {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return hasAttached(n, v.name()) && slices.Contains(n.Status.VolumesInUse, v1.UniqueVolumeName(v.name())), nil
	}, "%s in volumesAttached and volumesInUse of node %s", v.name(), node)
	return va
}

// waitDetached waits until v's VolumeAttachment on node is gone (the
// external-attacher removed its finalizer after ControllerUnpublish) and the
// node's volumesAttached no longer lists it.
func (e *env) waitDetached(v csiVolume, node string) {
	e.t.Helper()
	e.eventually(func() (bool, error) {
		_, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}, "VolumeAttachment %s of %s on %s gone", v.vaName(node), v.name(), node)
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	// Removed before the detach started, so already gone.
	if hasAttached(n, v.name()) {
		e.t.Fatalf("node %s still lists %s in volumesAttached after its VolumeAttachment is gone: %v", node, v.name(), n.Status.VolumesAttached)
	}
}

func hasAttached(node *v1.Node, name string) bool {
	return slices.ContainsFunc(node.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return string(a.Name) == name })
}

// waitEvent waits for an event on pod with reason whose message contains
// text, and returns its message.
func (e *env) waitEvent(pod, reason, text string) string {
	e.t.Helper()
	var msg string
	selector := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod, "reason": reason}.AsSelector().String()
	e.eventually(func() (bool, error) {
		events, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return false, err
		}
		for _, ev := range events.Items {
			if strings.Contains(ev.Message, text) {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	}, "event %s %q on pod %s/%s", reason, text, e.ns, pod)
	return msg
}
