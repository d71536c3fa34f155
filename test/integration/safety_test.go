package integration

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The safety rules, each against the real kube-apiserver, as a user meets
// them: a ReadWriteOnce volume on one node at a time however pods arrive, an
// orphan VolumeAttachment detached, a detach that completes at once waking
// the pod waiting for it, [RWO, ROX] volumes shared, a live pod's volume
// kept when its claim goes.

// nodesOfVAs watches the VolumeAttachments of a PV and records, at every
// event, the nodes holding one (in any state).
type nodesOfVAs struct {
	mu   sync.Mutex
	most int
	seen map[string]string // VA name -> node
	w    watch.Interface
}

func (e *env) watchNodesOf(pv string) *nodesOfVAs {
	e.t.Helper()
	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	n := &nodesOfVAs{seen: map[string]string{}, w: w}
	go func() {
		for ev := range w.ResultChan() {
			va, ok := ev.Object.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != pv {
				continue
			}
			n.mu.Lock()
			if ev.Type == watch.Deleted {
				delete(n.seen, va.Name)
			} else {
				n.seen[va.Name] = va.Spec.NodeName
			}
			var nodes []string
			for _, node := range n.seen {
				if !slices.Contains(nodes, node) {
					nodes = append(nodes, node)
				}
			}
			n.most = max(n.most, len(nodes))
			n.mu.Unlock()
		}
	}()
	e.t.Cleanup(w.Stop)
	return n
}

func (n *nodesOfVAs) maxNodes() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.most
}

// Defect 1: pods on two nodes sharing a ReadWriteOnce claim, created
// together, with many workers: one VolumeAttachment exists at a time.
func TestSafetySingleNodeAttachIsExclusive(t *testing.T) {
	e := newEnv(t, "exclusive")
	driver := e.name("csi.test")
	var nodes []string
	for i := range 4 {
		nodes = append(nodes, e.createNode(fmt.Sprintf("node-%d", i), true))
	}
	pv := e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	watched := e.watchNodesOf(pv.Name)
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.Workers = 16 })
	for i, node := range nodes {
		e.createPod(fmt.Sprintf("pod-%d", i), node, "claim")
	}
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		attached := 0
		for _, va := range vas.Items {
			if p := va.Spec.Source.PersistentVolumeName; p != nil && *p == pv.Name && va.Status.Attached {
				attached++
			}
		}
		return attached == 1, nil
	}, "the volume attached to one node")
	framework.Consistently(t, quietPeriod, func() error {
		if n := watched.maxNodes(); n > 1 {
			return fmt.Errorf("VolumeAttachments of %s on %d nodes at once", pv.Name, n)
		}
		return nil
	}, "one node at a time")
}

// Defect 2: a VolumeAttachment that no pod wants, on a managed node that
// has not mounted it, is detached, whether it exists at start or appears
// later.
func TestSafetyOrphanAttachmentsAreDetached(t *testing.T) {
	e := newEnv(t, "orphan")
	driver := e.name("csi.test")
	node := e.createNode("node-1", true)
	before := e.createCSIClaim("before", driver, "vol-before")
	later := e.createCSIClaim("later", driver, "vol-later")
	e.startAttacher(driver, "")
	orphan := func(pv *v1.PersistentVolume, handle string) {
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: framework.VolumeAttachmentName(handle, driver, node)},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
		}
		if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			got, ok, err := e.getVA(va.Name)
			return ok && got.Status.Attached, err
		}, "the attacher attaches the orphan %s", va.Name)
	}
	orphan(before, "vol-before")
	e.startController(nil)
	e.waitDetached(driver, "vol-before", node)
	orphan(later, "vol-later")
	e.waitDetached(driver, "vol-later", node)
}

// Defect 3: a detach that completes inside the call (its VolumeAttachment
// already gone) wakes the pod that waits for the volume on another node.
func TestSafetyInstantDetachWakesTheWaitingPod(t *testing.T) {
	e := newEnv(t, "instant")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	e.startAttacher(driver, "")
	e.startController(nil)
	e.setVolumesInUse(node1, framework.CSIVolumeName(driver, "vol-1"))
	e.createPod("pod-a", node1, "claim")
	e.waitAttached(driver, "vol-1", node1)
	e.createPod("pod-b", node2, "claim")
	e.waitReason("pod-b", v1.EventTypeWarning, "FailedAttachVolume")

	// Someone deletes the VolumeAttachment on node 1 while the volume is
	// still mounted; then pod-a goes and the node unmounts. The detach the
	// controller then starts finds nothing to delete: it completes at once.
	va := framework.VolumeAttachmentName("vol-1", driver, node1)
	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, va, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.deletePod("pod-a")
	e.setVolumesInUse(node1)
	e.waitAttached(driver, "vol-1", node2)
}

// Defect 4: a PV that lists ReadOnlyMany beside ReadWriteOnce is attached
// to every node that wants it, as upstream's IsMultiAttachAllowed says.
func TestSafetyReadOnlyManyIsMultiAttach(t *testing.T) {
	e := newEnv(t, "rox")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce, v1.ReadOnlyMany)
	e.startAttacher(driver, "")
	e.startController(nil)
	e.createPod("pod-a", node1, "claim")
	e.createPod("pod-b", node2, "claim")
	e.waitAttached(driver, "vol-1", node1)
	e.waitAttached(driver, "vol-1", node2)
	for _, pod := range []string{"pod-a", "pod-b"} {
		if w, err := e.warnings(pod); err != nil || len(w) != 0 {
			t.Errorf("pod %s: warnings %q (%v), want none", pod, w, err)
		}
	}
}

// Defect 5: a live pod whose claim is deleted keeps its volume, with a
// warning, even on a NotReady node past the max wait for unmount; once the
// pod has terminated (deleted, containers stopped) the volume is released.
func TestSafetyLivePodKeepsItsVolume(t *testing.T) {
	e := newEnv(t, "livepod")
	driver := e.name("csi.test")
	node := e.createNode("node-1", true)
	e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.MaxWaitForUnmount = 2 * time.Second })
	e.setVolumesInUse(node, framework.CSIVolumeName(driver, "vol-1"))
	pod := e.createPod("pod-a", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)
	kept := e.watchVA(va)
	defer kept.close()

	if err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Delete(e.ctx, "claim", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.setNodeReady(node, false)
	e.waitReason("pod-a", v1.EventTypeWarning, "VolumeKeptAttached")
	framework.Consistently(t, 3*quietPeriod, kept.intact, "the live pod's volume stays attached past the max wait")

	// The pod terminates: deleted, its containers stopped.
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c", State: v1.ContainerState{Terminated: &v1.ContainerStateTerminated{}}}}
	if _, err := e.client.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitDetached(driver, "vol-1", node)
}

// waitReason waits for an event of that type and reason on the pod,
// whatever its message.
func (e *env) waitReason(pod, eventType, reason string) {
	e.t.Helper()
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		events, err := e.podEvents(pod)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(events, func(ev v1.Event) bool { return ev.Type == eventType && ev.Reason == reason }), nil
	}, "event %s %s on pod %s", eventType, reason, pod)
}
