package integration

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/util/retry"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The safety guarantees of the README, each against the real API server:
// one node at a time for a single-node volume, orphans detached, a waiting
// pod woken by however the other node's detach completes, the PV's access
// modes deciding multi-attach, and a live pod keeping its volume.

// Pods on two nodes that share a ReadWriteOnce claim, created at the same
// moment, never get the volume attached to both: not one instant with two
// VolumeAttachments for it, however many workers run. The pod that loses is
// told, and gets the volume once the winner's pod is gone.
func TestSafetyOneNodeAtATimeForRWO(t *testing.T) {
	const volumes = 4
	e := newEnv(t, "safe-rwo")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	var watches []*attachmentWatch
	for i := range volumes {
		pv := e.createCSIClaim(fmt.Sprintf("claim-%d", i), driver, fmt.Sprintf("vol-%d", i), v1.ReadWriteOnce)
		watches = append(watches, e.watchAttachmentsOf(pv.Name))
	}
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.Workers = 20 })

	// Both pods of each claim at once, from two goroutines.
	var wg sync.WaitGroup
	errs := make(chan error, 2*volumes)
	for i := range volumes {
		for _, node := range []string{node1, node2} {
			wg.Go(func() {
				_, err := framework.CreatePod(e.ctx, e.client, e.ns, podOn(i, node, node1), node, fmt.Sprintf("claim-%d", i))
				errs <- err
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	oneAtATime := func() error {
		for _, w := range watches {
			if err := w.violations(); err != nil {
				return err
			}
		}
		return nil
	}
	winners := make([]string, volumes)
	for i := range volumes {
		handle := fmt.Sprintf("vol-%d", i)
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			if err := oneAtATime(); err != nil {
				return false, err
			}
			for _, node := range []string{node1, node2} {
				va, ok, err := e.getVA(framework.VolumeAttachmentName(handle, driver, node))
				if err != nil {
					return false, err
				}
				if ok && va.Status.Attached {
					winners[i] = node
					return true, nil
				}
			}
			return false, nil
		}, "volume %s attached to one of the nodes", handle)
		e.waitAttached(driver, handle, winners[i])
		loser := podOn(i, otherNode(winners[i], node1, node2), node1)
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			if err := oneAtATime(); err != nil {
				return false, err
			}
			warnings, err := e.warnings(loser)
			return slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "Waiting for detach for volume") }), err
		}, "pod %s told it waits for a detach elsewhere", loser)
	}
	framework.Consistently(t, quietPeriod, oneAtATime, "one VolumeAttachment at most per ReadWriteOnce volume")

	// The winners' pods go (their volumes were never mounted): each volume
	// moves to the other node, still never on two at once.
	for i := range volumes {
		e.deletePod(podOn(i, winners[i], node1))
	}
	for i := range volumes {
		handle := fmt.Sprintf("vol-%d", i)
		node := otherNode(winners[i], node1, node2)
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			if err := oneAtATime(); err != nil {
				return false, err
			}
			va, ok, err := e.getVA(framework.VolumeAttachmentName(handle, driver, node))
			return ok && va.Status.Attached, err
		}, "volume %s moved to node %s", handle, node)
		e.waitAttached(driver, handle, node)
	}
	if err := oneAtATime(); err != nil {
		t.Fatal(err)
	}
}

func podOn(i int, node, node1 string) string {
	if node == node1 {
		return fmt.Sprintf("pod-%d-a", i)
	}
	return fmt.Sprintf("pod-%d-b", i)
}

func otherNode(node, node1, node2 string) string {
	if node == node1 {
		return node2
	}
	return node1
}

// An orphan VolumeAttachment (attached, on a managed node, wanted by no
// pod, not mounted) is detached, whether it exists when the controller
// starts or appears while it runs. A VolumeAttachment a pod wants is kept.
func TestSafetyOrphanAttachmentDetached(t *testing.T) {
	e := newEnv(t, "safe-orphan")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	atStart := e.createCSIClaim("at-start", driver, "vol-at-start")
	later := e.createCSIClaim("later", driver, "vol-later")
	e.createCSIClaim("wanted", driver, "vol-wanted")
	e.startAttacher(driver, "")
	e.createPod("pod", node, "wanted")
	e.createAttachedVA(driver, "vol-at-start", atStart.Name, node)

	e.startController(nil)
	wanted := e.waitAttached(driver, "vol-wanted", node)
	kept := e.watchVA(wanted)
	e.waitDetached(driver, "vol-at-start", node)

	// Mounted when it appears, so that it is surely attached before the
	// controller may detach it; then unmounted. The node's volumesInUse and
	// the VolumeAttachment come through two watches: a controller that reads
	// the orphan first knows of no mount and rightly detaches it. That try
	// is made again, once the mount is surely read; a controller that never
	// heeds the mount detaches every try and the wait fails.
	laterName := framework.CSIVolumeName(driver, "vol-later")
	laterVA := framework.VolumeAttachmentName("vol-later", driver, node)
	e.setVolumesInUse(node, laterName)
	created, tries := false, 0
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		if !created {
			tries++
			created = e.createAttachedVA(driver, "vol-later", later.Name, node) != nil
			return false, nil
		}
		if _, listed, err := e.attachedInStatus(node, laterName); listed || err != nil {
			return listed, err
		}
		_, exists, err := e.getVA(laterVA)
		if err == nil && !exists {
			t.Logf("the orphan was detached before the controller read the mount (try %d); creating it again", tries)
			created = false
		}
		return false, err
	}, "the mounted orphan kept and listed in node status")
	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-later", node)
	if err := kept.intact(); err != nil {
		t.Errorf("the volume a pod wants: %v", err)
	}
}

// An orphan VolumeAttachment whose volume the node reports in use is not
// detached while the node is Ready; once unmounted, it is.
func TestSafetyOrphanInUseKept(t *testing.T) {
	e := newEnv(t, "safe-orphan-inuse")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	pv := e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.setVolumesInUse(node, framework.CSIVolumeName(driver, "vol-1"))
	va := e.createAttachedVA(driver, "vol-1", pv.Name, node)
	vw := e.watchVA(va)

	e.startController(nil)
	// The controller has read the VolumeAttachment once it reports it.
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-1"))
		return listed, err
	}, "the recovered attachment listed in node status")
	framework.Consistently(t, quietPeriod, vw.intact, "the mounted orphan to stay attached")

	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-1", node)
}

// createAttachedVA creates a VolumeAttachment as another controller would
// have, marked attached as the external-attacher would; nil if it was
// deleted before that.
func (e *env) createAttachedVA(driver, handle, pvName, node string) *storagev1.VolumeAttachment {
	e.t.Helper()
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: framework.VolumeAttachmentName(handle, driver, node)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	}
	created, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create VolumeAttachment: %v", err)
	}
	created, err = e.client.StorageV1().VolumeAttachments().Patch(e.ctx, created.Name, types.MergePatchType,
		[]byte(`{"status":{"attached":true}}`), metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		// A running controller may delete it before it is marked attached
		// (an unwanted attach in progress): already detached.
		e.t.Logf("VolumeAttachment %s deleted before it was marked attached", va.Name)
		return nil
	}
	if err != nil {
		e.t.Fatalf("mark VolumeAttachment attached: %v", err)
	}
	return created
}

// A detach that completes at once (the in-tree iSCSI attacher only records
// it) wakes the pod waiting for the volume on another node: it is attached
// there with no restart and no periodic sync.
func TestSafetyInstantDetachWakesWaitingPod(t *testing.T) {
	e := newEnv(t, "safe-wake")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	iqn := "iqn.2001-04.com.example:" + e.prefix
	name := "kubernetes.io/iscsi/10.0.0.1:3260:" + iqn + ":0"
	e.createClaim("claim", v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{
		TargetPortal: "10.0.0.1:3260", IQN: iqn, Lun: 0}}, v1.ReadWriteOnce)
	// The periodic sync is far beyond the test's deadlines.
	e.startController(func(o *app.Options) { o.ReconcileSyncPeriod = time.Hour })

	e.setVolumesInUse(node1, name)
	e.createPod("pod-a", node1, "claim")
	e.waitListed(node1, name)
	e.createPod("pod-b", node2, "claim")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		warnings, err := e.warnings("pod-b")
		return slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "Waiting for detach for volume") }), err
	}, "pod-b told it waits for a detach elsewhere")

	e.deletePod("pod-a")
	framework.Consistently(t, quietPeriod, func() error {
		if _, listed, err := e.attachedInStatus(node2, name); err != nil || listed {
			return fmt.Errorf("attached to node-2 while still mounted on node-1 (err %v)", err)
		}
		return nil
	}, "the volume to stay on node-1 while mounted there")
	e.setVolumesInUse(node1)
	e.waitListed(node2, name)
	if _, listed, err := e.attachedInStatus(node1, name); err != nil || listed {
		t.Errorf("node-1 status still lists %s (err %v)", name, err)
	}
}

// A CSI detach whose VolumeAttachment is deleted by someone else while the
// controller detaches it also wakes the waiting pod.
func TestSafetyDetachOfVanishedAttachmentWakesWaitingPod(t *testing.T) {
	e := newEnv(t, "safe-wake-csi")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	e.createCSIClaim("claim", driver, "vol-1", v1.ReadWriteOnce)
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.ReconcileSyncPeriod = time.Hour })

	e.createPod("pod-a", node1, "claim")
	va := e.waitAttached(driver, "vol-1", node1)
	e.createPod("pod-b", node2, "claim")
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		warnings, err := e.warnings("pod-b")
		return slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "Waiting for detach for volume") }), err
	}, "pod-b told it waits for a detach elsewhere")

	e.deletePod("pod-a")
	if err := ignoreNotFound(e.client.StorageV1().VolumeAttachments().Delete(e.ctx, va.Name, metav1.DeleteOptions{})); err != nil {
		t.Fatal(err)
	}
	e.waitAttached(driver, "vol-1", node2)
}

// waitListed waits until node.status.volumesAttached lists volume.
func (e *env) waitListed(node, volume string) {
	e.t.Helper()
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		_, listed, err := e.attachedInStatus(node, volume)
		return listed, err
	}, "node %s status lists %s", node, volume)
}

// A PV listing ReadWriteOnce and ReadOnlyMany may attach to many nodes, as
// upstream reads the PV's modes: both pods get it, neither is warned.
func TestSafetyReadOnlyManyPVOnTwoNodes(t *testing.T) {
	e := newEnv(t, "safe-rox")
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
		warnings, err := e.warnings(pod)
		if err != nil {
			t.Fatal(err)
		}
		if len(warnings) != 0 {
			t.Errorf("pod %s: unexpected warnings %q", pod, warnings)
		}
	}
}

// A live pod whose claim is force-deleted keeps its volume attached, with a
// VolumeKeptAttached warning, even on a NotReady node long past the max wait
// for unmount, and even though nothing reports it mounted.
func TestSafetyLivePodKeepsVolumeWhenClaimDeleted(t *testing.T) {
	const maxWait = 2 * time.Second
	e := newEnv(t, "safe-keep")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.MaxWaitForUnmount = maxWait })

	e.createPod("pod", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)
	vw := e.watchVA(va)
	e.setNodeReady(node, false)
	if err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Delete(e.ctx, "claim", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		events, err := e.podEvents("pod")
		return slices.ContainsFunc(events, func(ev v1.Event) bool {
			return ev.Type == v1.EventTypeWarning && ev.Reason == "VolumeKeptAttached" &&
				strings.Contains(ev.Message, framework.CSIVolumeName(driver, "vol-1"))
		}), err
	}, "VolumeKeptAttached warning on the pod")
	framework.Consistently(t, 3*maxWait, vw.intact, "the live pod's volume to stay attached (three times the max wait for unmount)")
	if _, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-1")); err != nil || !listed {
		t.Errorf("node status no longer lists the live pod's volume (err %v)", err)
	}

	// The pod goes: now its volume may go.
	e.deletePod("pod")
	e.waitDetached(driver, "vol-1", node)
}

// A pod being deleted keeps its volume while a container runs, and releases
// it once all its containers have stopped, before the pod object is gone.
func TestSafetyDeletingPodReleasesVolumeWhenContainersStop(t *testing.T) {
	e := newEnv(t, "safe-deleting")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.startController(nil)

	e.createPod("pod", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)
	e.setContainerState("pod", v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: metav1.Now()}})
	vw := e.watchVA(va)
	// A graceful delete: with no kubelet to finish it, the pod stays, being
	// deleted.
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	framework.Consistently(t, quietPeriod, vw.intact, "the volume to stay attached while a container of the deleted pod runs")

	now := metav1.Now()
	e.setContainerState("pod", v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, StartedAt: now, FinishedAt: now}})
	e.waitDetached(driver, "vol-1", node)
	if p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "pod", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Errorf("the pod should still exist, being deleted: %v, err %v", p, err)
	}
}

// setContainerState writes the state of the pod's one container, as its
// kubelet would.
func (e *env) setContainerState(pod string, state v1.ContainerState) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		// Still Running with its container stopped: a deleted pod's phase
		// is the last thing its kubelet writes.
		p.Status.Phase = v1.PodRunning
		c := p.Spec.Containers[0]
		p.Status.ContainerStatuses = []v1.ContainerStatus{{
			Name: c.Name, Image: c.Image, ImageID: "docker-pullable://" + c.Image, State: state,
			Ready: state.Running != nil, Started: new(state.Running != nil),
		}}
		_, err = e.client.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("set container state of pod %s: %v", pod, err)
	}
}

// attachmentWatch records, from the moment it starts, every
// VolumeAttachment of one PV, and every moment two of them existed at once
// (one being deleted counts: it may still be attached).
type attachmentWatch struct {
	pv   string
	mu   sync.Mutex
	live map[string]string // name -> node
	bad  []string
}

func (e *env) watchAttachmentsOf(pv string) *attachmentWatch {
	e.t.Helper()
	aw := &attachmentWatch{pv: pv, live: map[string]string{}}
	e.watchAttachments(aw.observe, func(msg string) {
		aw.mu.Lock()
		aw.bad = append(aw.bad, msg)
		aw.mu.Unlock()
	})
	return aw
}

func (aw *attachmentWatch) observe(typ watch.EventType, va *storagev1.VolumeAttachment) {
	if src := va.Spec.Source.PersistentVolumeName; src == nil || *src != aw.pv {
		return
	}
	aw.mu.Lock()
	defer aw.mu.Unlock()
	if typ == watch.Deleted {
		delete(aw.live, va.Name)
		return
	}
	aw.live[va.Name] = va.Spec.NodeName
	if len(aw.live) > 1 {
		var nodes []string
		for _, n := range aw.live {
			nodes = append(nodes, n)
		}
		slices.Sort(nodes)
		aw.bad = append(aw.bad, fmt.Sprintf("PV %s had VolumeAttachments on %v at resourceVersion %s", aw.pv, nodes, va.ResourceVersion))
	}
}

// violations is an error naming every moment two VolumeAttachments existed.
func (aw *attachmentWatch) violations() error {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	if len(aw.bad) > 0 {
		return fmt.Errorf("%s", strings.Join(aw.bad, "; "))
	}
	return nil
}
