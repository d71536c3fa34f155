package integration

import (
	"fmt"
	"net/http"
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

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The API as it is, rougher than the controller's own writes make it look:
// VolumeAttachments deleted and created again by others, watches that
// deliver late or relist and skip versions, answers that come after the
// write landed, calls refused, one disk under two names. Where the timing
// matters, the controller talks to the API server through an apiProxy that
// makes it happen.

const (
	ebsDriver = "ebs.csi.aws.com"
	ebsPlugin = "kubernetes.io/aws-ebs"
)

// startControllerVia runs the controller with its API calls and watches
// going through p.
func (e *env) startControllerVia(p *apiProxy, configure func(*app.Options)) *framework.Controller {
	e.t.Helper()
	return e.startController(func(o *app.Options) {
		o.Kubeconfig = p.kubeconfig
		if configure != nil {
			configure(o)
		}
	})
}

// An admin deletes, as fast as they come back, the VolumeAttachments of
// ReadWriteOnce volumes whose attach fails, each wanted by pods on two nodes
// (the one that came second told it waits for a detach elsewhere): each time
// the controller creates one again, and no volume ever has VolumeAttachments on
// both nodes, not even for a moment. Once the pod of the node that holds a
// volume goes, the other node gets it. Several volumes at once, and kubelet's
// churn of volumesInUse, keep the controller's workers busy, which widens
// the race this is about (the add of an object created again read after the
// delete of the one before it); it stays too narrow to be hit every run:
// the controller's unit tests pin it.
func TestVolumeAttachmentDeletedByAdminNeverAttachesTwice(t *testing.T) {
	const volumes, deletes = 8, 15
	e := newEnv(t, "admin-delete")
	driver := e.name("csi.test")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	handles := make([]string, volumes)
	disks := map[string]string{}
	for i := range volumes {
		handles[i] = fmt.Sprintf("fail-%d", i)
		pv := e.createCSIClaim(fmt.Sprintf("claim-%d", i), driver, handles[i], v1.ReadWriteOnce)
		disks[pv.Name] = handles[i]
	}
	dw := e.watchDisk(disks)
	e.startAttacher(driver, "fail-")
	e.startController(func(o *app.Options) { o.Workers = 20 })

	for i := range volumes {
		e.createPod(podOn(i, node1, node1), node1, fmt.Sprintf("claim-%d", i))
	}
	var rv string
	for _, handle := range handles {
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			got, ok, err := e.getVA(framework.VolumeAttachmentName(handle, driver, node1))
			if ok {
				rv = got.ResourceVersion
			}
			return ok && got.Status.AttachError != nil, err
		}, "a VolumeAttachment of %s on node %s with an attach error", handle, node1)
	}
	for i := range volumes {
		e.createPod(podOn(i, node2, node1), node2, fmt.Sprintf("claim-%d", i))
	}
	for i := range volumes {
		e.waitWaitingForDetach(podOn(i, node2, node1))
	}

	// Every VolumeAttachment of the volumes, as soon as it is seen, is
	// deleted, until each volume's was deleted that many times.
	list, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	deleted := map[types.UID]bool{}
	count := map[string]int{}
	remove := func(va *storagev1.VolumeAttachment) {
		src := va.Spec.Source.PersistentVolumeName
		if va.DeletionTimestamp != nil || deleted[va.UID] || src == nil || disks[*src] == "" || count[disks[*src]] >= deletes {
			return
		}
		deleted[va.UID] = true
		count[disks[*src]]++
		e.deleteVA(va.Name, va.UID)
	}
	// Meanwhile kubelet on node-1 reports the volumes in use and not, again
	// and again: each change syncs them on node-1 once more.
	var names []string
	for _, handle := range handles {
		names = append(names, framework.CSIVolumeName(driver, handle))
	}
	stopChurn := make(chan struct{})
	churned := make(chan error, 1)
	go func() {
		var err error
		for i := 0; err == nil; i++ {
			select {
			case <-stopChurn:
				churned <- nil
				return
			default:
			}
			err = framework.SetVolumesInUse(e.ctx, e.client, node1, names[:(i%2)*len(names)]...)
		}
		churned <- err
	}()
	for i := range list.Items {
		remove(&list.Items[i])
	}
	done := func() bool {
		for _, handle := range handles {
			if count[handle] < deletes {
				return false
			}
		}
		return true
	}
	tick := time.NewTicker(framework.PollInterval)
	defer tick.Stop()
	deadline := time.After(waitTimeout)
	for !done() {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("VolumeAttachment watch ended")
			}
			if got, isVA := ev.Object.(*storagev1.VolumeAttachment); isVA && ev.Type != watch.Deleted {
				remove(got)
			}
		case <-tick.C:
		case <-deadline:
			t.Fatalf("VolumeAttachments deleted by volume: %v; not created again within %s (violations: %v)", count, waitTimeout, dw.violations())
		}
		if err := dw.violations(); err != nil {
			t.Fatal(err)
		}
	}

	close(stopChurn)
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
	e.setVolumesInUse(node1)

	// One comes back for each volume after its last delete, and stays
	// alone; then it moves to the other node when its pod goes.
	holders := make([]string, volumes)
	for i, handle := range handles {
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			if err := dw.violations(); err != nil {
				return false, err
			}
			for _, node := range []string{node1, node2} {
				got, ok, err := e.getVA(framework.VolumeAttachmentName(handle, driver, node))
				if err != nil {
					return false, err
				}
				if ok && !deleted[got.UID] {
					holders[i] = node
					return true, nil
				}
			}
			return false, nil
		}, "a VolumeAttachment of %s created again after its last delete", handle)
	}
	framework.Consistently(t, quietPeriod, dw.violations, "each volume's VolumeAttachments on one node at most")
	for i, holder := range holders {
		e.deletePod(podOn(i, holder, node1))
	}
	for i, handle := range handles {
		holder, other := holders[i], otherNode(holders[i], node1, node2)
		framework.Eventually(t, waitTimeout, func() (bool, error) {
			if err := dw.violations(); err != nil {
				return false, err
			}
			_, held, err := e.getVA(framework.VolumeAttachmentName(handle, driver, holder))
			if err != nil || held {
				return false, err
			}
			_, moved, err := e.getVA(framework.VolumeAttachmentName(handle, driver, other))
			return moved, err
		}, "volume %s moved from node %s to node %s", handle, holder, other)
	}
}

// deleteVA deletes a VolumeAttachment as an admin would, that object only:
// one gone or created again meanwhile is left alone.
func (e *env) deleteVA(name string, uid types.UID) {
	e.t.Helper()
	err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		e.t.Fatalf("delete VolumeAttachment %s: %v", name, err)
	}
}

// waitWaitingForDetach waits for the "Waiting for detach" warning on pod.
func (e *env) waitWaitingForDetach(pod string) {
	e.t.Helper()
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		warnings, err := e.warnings(pod)
		return slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "Waiting for detach for volume") }), err
	}, "pod %s told it waits for a detach elsewhere", pod)
}

// The controller writes node status listing a volume; before the answer
// comes, a third party deletes the volume's VolumeAttachment and the pod
// using it goes. The write landed: node status lists the volume, which
// kubelet reads as attached. The controller must take it out, and when the
// VolumeAttachment comes back (another controller creates it again,
// attached), detach it only after node status stopped listing it.
func TestDetachNeverStartsWhileStatusListsVolumeWrittenDuringItsDeletion(t *testing.T) {
	e := newEnv(t, "write-race")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	pv1 := e.createCSIClaim("claim-1", driver, "vol-1")
	pv2 := e.createCSIClaim("claim-2", driver, "vol-2")
	vol1, vol2 := framework.CSIVolumeName(driver, "vol-1"), framework.CSIVolumeName(driver, "vol-2")
	sw := e.watchStatusAndAttachments(node, map[string]string{pv1.Name: vol1, pv2.Name: vol2})
	e.startAttacher(driver, "")
	e.startControllerVia(p, nil)

	e.createPod("pod-1", node, "claim-1")
	va1 := e.waitAttached(driver, "vol-1", node)

	// The next write of the node's status lists vol-1 (and adds vol-2); its
	// answer is held.
	answer := p.holdAnswer(isCall(http.MethodPatch, "nodes/"+node+"/status"))
	e.createPod("pod-2", node, "claim-2")
	waitClosed(t, answer.held, waitTimeout, "a node status write of the controller")
	if _, listed, err := e.attachedInStatus(node, vol1); err != nil || !listed {
		t.Fatalf("the write whose answer is held does not list %s (err %v)", vol1, err)
	}
	// The pod first, so that the controller, which reads each within
	// milliseconds, does not create the VolumeAttachment again for it.
	noDetach := func() error { return sw.detachesWhileListed(p) }
	e.deletePod("pod-1")
	framework.Consistently(t, quietPeriod/4, noDetach, "no detach while a node status write is in flight")
	e.deleteVA(va1.Name, va1.UID)
	framework.Consistently(t, quietPeriod/2, noDetach, "no detach while a node status write is in flight")
	answer.release()

	e.createAttachedVAAgain(driver, "vol-1", pv1.Name, node)
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		if d := sw.detachesWhileListed(p); d != nil {
			return false, d
		}
		_, exists, err := e.getVA(va1.Name)
		if err != nil || exists {
			return false, err
		}
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return slices.Equal(attachedNames(n), []string{vol2}), nil
	}, "vol-1 detached, node status listing exactly what is attached (%s)", vol2)
	if err := sw.detachesWhileListed(p); err != nil {
		t.Fatal(err)
	}
}

// createAttachedVAAgain creates a volume's VolumeAttachment, attached, as
// another controller would, unless it exists: then it is marked attached,
// as the external-attacher would. One deleted meanwhile is left gone.
func (e *env) createAttachedVAAgain(driver, handle, pvName, node string) {
	e.t.Helper()
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: framework.VolumeAttachmentName(handle, driver, node)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	}
	_, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		e.t.Fatalf("create VolumeAttachment %s: %v", va.Name, err)
	}
	_, err = e.client.StorageV1().VolumeAttachments().Patch(e.ctx, va.Name, types.MergePatchType,
		[]byte(`{"status":{"attached":true}}`), metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatalf("mark VolumeAttachment %s attached: %v", va.Name, err)
	}
}

func attachedNames(n *v1.Node) []string {
	var names []string
	for _, av := range n.Status.VolumesAttached {
		names = append(names, string(av.Name))
	}
	slices.Sort(names)
	return names
}

// A node is deleted while a volume is mounted there, and the controller
// learns it from a relist after its watch expired: the deletion comes as a
// tombstone whose copy of the node is from before the mount. No pod is
// attached to a node that is gone, yet the volume may still be mounted: it
// stays attached until the max wait for unmount has passed
// (--max-wait-for-unmount-deleted-node is not set), and is detached then.
func TestNodeDeletionSeenByRelistWaitsMaxWaitForUnmount(t *testing.T) {
	const maxWait = 10 * time.Second
	e := newEnv(t, "tombstone")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSIClaim("claim", driver, "vol-1")
	e.startAttacher(driver, "")
	e.startControllerVia(p, func(o *app.Options) { o.MaxWaitForUnmount = maxWait })

	e.createPod("pod", node, "claim")
	va := e.waitAttached(driver, "vol-1", node)
	vw := e.watchVA(va)

	// The controller sees nothing more of the node: kubelet mounts the
	// volume, the node is deleted, and the watch expires.
	p.holdEvents("nodes")
	e.setVolumesInUse(node, framework.CSIVolumeName(driver, "vol-1"))
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	relisted := p.expireWatches("nodes")
	waitClosed(t, relisted, waitTimeout, "the controller's nodes listed again")
	framework.Consistently(t, maxWait-time.Second, vw.intact,
		"the volume, maybe mounted on the deleted node, to stay attached for the max wait for unmount")
	vw.close()
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		_, exists, err := e.getVA(va.Name)
		return !exists, err
	}, "VolumeAttachment %s deleted once the max wait for unmount passed", va.Name)
}

// The node's managed annotation is removed and put back by someone else
// while the controller writes the node's status, and the controller's watch
// of nodes misses both changes (it expires, and the relist skips them): the
// controller learns of each only from the answer to its own write. Once its
// pod is gone and kubelet has unmounted it, a volume is still detached, not
// left waiting for the node's pods to be read again, and the ReadWriteOnce
// volume goes to the pod waiting for it on another node.
func TestManagementToggleSeenOnlyInStatusAnswersStillDetaches(t *testing.T) {
	e := newEnv(t, "toggle-answer")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	node2 := e.createNode("node-2", true)
	for i := 1; i <= 3; i++ {
		e.createCSIClaim(fmt.Sprintf("claim-%d", i), driver, fmt.Sprintf("vol-%d", i), v1.ReadWriteOnce)
	}
	// No attacher: the test marks each VolumeAttachment attached when a
	// node status write should follow.
	e.startControllerVia(p, nil)
	vol1 := framework.CSIVolumeName(driver, "vol-1")
	e.setVolumesInUse(node, vol1)
	var vas []string
	for i := 1; i <= 3; i++ {
		e.createPod(fmt.Sprintf("pod-%d", i), node, fmt.Sprintf("claim-%d", i))
		vas = append(vas, e.waitVA(framework.VolumeAttachmentName(fmt.Sprintf("vol-%d", i), driver, node)).Name)
	}
	e.markAttached(vas[0])
	e.waitListed(node, vol1)

	p.holdEvents("nodes")
	e.updateNode(node, func(n *v1.Node) { delete(n.Annotations, framework.ControllerManagedAnnotation) })
	// The write that lists vol-2 is answered with the node unmanaged...
	e.markAttached(vas[1])
	e.waitListed(node, framework.CSIVolumeName(driver, "vol-2"))
	e.updateNode(node, func(n *v1.Node) {
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[framework.ControllerManagedAnnotation] = "true"
	})
	// ... the one that lists vol-3 with the node managed again.
	e.markAttached(vas[2])
	e.waitListed(node, framework.CSIVolumeName(driver, "vol-3"))
	waitClosed(t, p.expireWatches("nodes"), waitTimeout, "the controller's nodes listed again")

	e.deletePod("pod-1")
	e.createPod("pod-4", node2, "claim-1")
	e.waitWaitingForDetach("pod-4")
	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-1", node)
	e.markAttached(e.waitVA(framework.VolumeAttachmentName("vol-1", driver, node2)).Name)
	e.waitAttached(driver, "vol-1", node2)
	for _, handle := range []string{"vol-2", "vol-3"} {
		if _, ok, err := e.getVA(framework.VolumeAttachmentName(handle, driver, node)); err != nil || !ok {
			t.Errorf("VolumeAttachment of %s, whose pod runs: exists %v, err %v", handle, ok, err)
		}
	}
}

// A volume mounted on a NotReady node whose pod is gone is detached once the
// max wait for unmount has passed, and the delete of its VolumeAttachment is
// refused. The node comes back Ready, the volume still mounted, and the
// refusal is lifted: the detach that failed is not finished while kubelet
// reports the volume in use. Once it no longer does, the volume is detached.
func TestFailedForcedDetachNotRetriedOnceNodeIsBackWithVolumeMounted(t *testing.T) {
	const maxWait = 2 * time.Second
	e := newEnv(t, "force-fail")
	p := startAPIProxy(t)
	driver := e.name("csi.test")
	e.startAttacher(driver, "")
	e.startControllerVia(p, func(o *app.Options) { o.MaxWaitForUnmount = maxWait })
	vaName := framework.VolumeAttachmentName("vol-1", driver, e.name("node"))
	lift, refused := p.refuse(isCall(http.MethodDelete, "volumeattachments/"+vaName),
		`admission webhook "deny-detach.adc.test" denied the request: detach refused by the test`)

	node, va, _ := mountedOnDeadNode(e, driver)
	framework.Eventually(t, waitTimeout, func() (bool, error) { return refused() > 0, nil },
		"the forced detach of %s attempted (and refused)", va.Name)
	vw := e.watchVA(va)
	e.setNodeReady(node, true)
	framework.Consistently(t, time.Second, vw.intact, "the VolumeAttachment to stay while its delete is refused")
	lift()
	framework.Consistently(t, 6*time.Second, vw.intact,
		"the volume mounted on a Ready node to stay attached, though its forced detach had started")

	e.setVolumesInUse(node)
	e.waitDetached(driver, "vol-1", node)
}

// One EBS disk under two names, aws://us-east-1a/vol-x in one ReadWriteOnce
// PV and vol-x in another, migrated to ebs.csi.aws.com on both nodes: pods on
// two nodes, one per PV, created at the same moment, never get the disk
// attached to both nodes, not even for a moment, however many workers run.
func TestOneDiskUnderTwoNamesNeverOnTwoNodes(t *testing.T) {
	const disks, rounds = 4, 3
	e := newEnv(t, "two-names")
	node1 := e.createNode("node-1", true)
	node2 := e.createNode("node-2", true)
	for _, node := range []string{node1, node2} {
		e.createCSINode(node, []storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-"+node)}, ebsPlugin)
	}
	pvDisk := map[string]string{}
	handles := make([]string, disks)
	for i := range disks {
		handles[i] = fmt.Sprintf("vol-%s-%d", e.prefix, i)
		for _, spelling := range []struct{ claim, id string }{
			{fmt.Sprintf("zonal-%d", i), "aws://us-east-1a/" + handles[i]},
			{fmt.Sprintf("bare-%d", i), handles[i]},
		} {
			pv := e.createClaim(spelling.claim, v1.PersistentVolumeSource{
				AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: spelling.id},
			}, v1.ReadWriteOnce)
			pvDisk[pv.Name] = handles[i]
		}
	}
	dw := e.watchDisk(pvDisk)
	framework.StartAttacher(t, e.client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	e.startController(func(o *app.Options) { o.Workers = 20 })

	for round := range rounds {
		// The nodes swap spellings every round.
		zonalOn, bareOn := node1, node2
		if round%2 == 1 {
			zonalOn, bareOn = node2, node1
		}
		var wg sync.WaitGroup
		errs := make(chan error, 2*disks)
		for i := range disks {
			for _, pod := range []struct{ name, node, claim string }{
				{fmt.Sprintf("zonal-%d-%d", i, round), zonalOn, fmt.Sprintf("zonal-%d", i)},
				{fmt.Sprintf("bare-%d-%d", i, round), bareOn, fmt.Sprintf("bare-%d", i)},
			} {
				wg.Go(func() {
					_, err := framework.CreatePod(e.ctx, e.client, e.ns, pod.name, pod.node, pod.claim)
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
		for _, handle := range handles {
			framework.Eventually(t, waitTimeout, func() (bool, error) {
				if err := dw.violations(); err != nil {
					return false, err
				}
				for _, node := range []string{node1, node2} {
					va, ok, err := e.getVA(framework.VolumeAttachmentName(handle, ebsDriver, node))
					if err != nil || (ok && va.Status.Attached) {
						return ok, err
					}
				}
				return false, nil
			}, "disk %s attached to one of the nodes (round %d)", handle, round)
		}
		framework.Consistently(t, quietPeriod, dw.violations, "each disk on one node at most")

		if err := e.client.CoreV1().Pods(e.ns).DeleteCollection(e.ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, handle := range handles {
			for _, node := range []string{node1, node2} {
				e.waitDetached(ebsDriver, handle, node)
			}
		}
		if err := dw.violations(); err != nil {
			t.Fatal(err)
		}
	}
}
