package integration

import (
	"fmt"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A restarted controller rebuilds its state before it detaches anything: the
// volumes still wanted keep their VolumeAttachments (same UID) and their node
// status entries throughout, not even withdrawn for one write, while the
// volume of a pod deleted during the downtime is detached within seconds, not
// at some periodic resync minutes later.
func TestRestartNoSpuriousDetach(t *testing.T) {
	// Several kept pods: a controller that reconciled before it had read
	// every pod would have more than one chance to get one wrong.
	const kept = 8
	e := newEnv(t, "restart")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.startAttacher(driver, "")
	first := e.startController(nil)

	var keptNames []string
	keptVAs := map[string]*storagev1.VolumeAttachment{}
	for i := range kept {
		handle := fmt.Sprintf("vol-keep-%d", i)
		e.createCSIClaim(fmt.Sprintf("keep-%d", i), driver, handle)
		e.createPod(fmt.Sprintf("pod-keep-%d", i), node, fmt.Sprintf("keep-%d", i))
		keptNames = append(keptNames, framework.CSIVolumeName(driver, handle))
	}
	e.createCSIClaim("gone", driver, "vol-gone")
	e.createPod("pod-gone", node, "gone")
	for i := range kept {
		handle := fmt.Sprintf("vol-keep-%d", i)
		keptVAs[handle] = e.waitAttached(driver, handle, node)
	}
	e.waitAttached(driver, "vol-gone", node)

	if err := first.Stop(stopTimeout); err != nil {
		t.Fatal(err)
	}
	// The kept volumes are deliberately not in volumesInUse: nothing but the
	// controller's own state protects them from a spurious detach.
	var watches []*vaWatch
	for _, va := range keptVAs {
		watches = append(watches, e.watchVA(va))
	}
	nw := e.watchNode(node)
	e.deletePod("pod-gone")
	restarted := time.Now()
	// The periodic sync stays at its default (1m): the prompt detach must not
	// depend on it.
	second := e.startController(nil)

	keptIntact := func() error {
		for _, vw := range watches {
			if err := vw.intact(); err != nil {
				return fmt.Errorf("volume still in use, after the restart: %w", err)
			}
		}
		if m := nw.missing(keptNames...); len(m) != 0 {
			return fmt.Errorf("node status stopped listing a volume still in use, after the restart: %v", m)
		}
		return nil
	}
	framework.Eventually(t, 20*time.Second, func() (bool, error) {
		if err := keptIntact(); err != nil {
			return false, err
		}
		_, exists, err := e.getVA(framework.VolumeAttachmentName("vol-gone", driver, node))
		if err != nil || exists {
			return false, err
		}
		_, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, "vol-gone"))
		return !listed, err
	}, "volume of the pod deleted during the downtime detached")
	t.Logf("volume of the pod deleted during the downtime detached %s after the restart", time.Since(restarted).Round(time.Millisecond))

	// Give the restarted controller time to act on anything it may have got
	// wrong about the kept volumes.
	framework.Consistently(t, quietPeriod, keptIntact, "the kept volumes to stay attached")
	assertRunning(t, second)
}
