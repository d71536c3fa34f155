package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The controller's graces before a warning (pkg/controller claimGrace,
// pkg/reconciler undecidedGrace), and a margin for the API's timestamps
// and the informers.
const (
	claimGrace     = 10 * time.Second
	undecidedGrace = 30 * time.Second
	graceMargin    = 3 * time.Second
	// timestampGranularity: creation timestamps are whole seconds, so the
	// grace may end up to a second before it would by the test's clock.
	timestampGranularity = time.Second
)

// noWarnings fails once one of pods has a Warning event.
func (e *env) noWarnings(pods ...string) func() error {
	return func() error {
		for _, pod := range pods {
			warnings, err := e.warnings(pod)
			if err != nil {
				return err
			}
			if len(warnings) != 0 {
				return fmt.Errorf("pod %s warned: %q", pod, warnings)
			}
		}
		return nil
	}
}

// A generic ephemeral volume's claim comes after its pod (the ephemeral
// volume controller makes it): the pod is not warned while the claim may
// yet come, and is warned once it has been missing for the grace; a claim
// that comes within it attaches, and its pod is never warned.
func TestMissingClaimWarnedAfterGrace(t *testing.T) {
	e := newEnv(t, "claimgrace")
	driver := e.name("csi.test")
	node := e.createNode("node", true)
	e.createCSINode(node, []storagev1.CSINodeDriver{framework.CSINodeDriver(driver, node)})
	e.startAttacher(driver, "")
	e.startController(nil)

	start := time.Now()
	if _, err := framework.CreatePodWithVolumes(e.ctx, e.client, e.ns, "never", node, allKindsEphemeral("scratch")); err != nil {
		t.Fatal(err)
	}
	late, err := framework.CreatePodWithVolumes(e.ctx, e.client, e.ns, "late", node, allKindsEphemeral("scratch"))
	if err != nil {
		t.Fatal(err)
	}
	// The ephemeral volume controller, a moment later.
	framework.Consistently(t, 2*time.Second, e.noWarnings("never", "late"), "no warning right after the pods")
	claim := framework.PVC(e.ns, "late-scratch", e.name("pv-late"))
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "late", UID: late.UID,
		Controller: new(true), BlockOwnerDeletion: new(true)}}
	e.createPendingClaim(claim)
	e.createPV(framework.PV(e.name("pv-late"), framework.CSISource(driver, "vol-late"), claim))
	e.setClaimBound(claim.Name)
	e.waitAttached(driver, "vol-late", node)

	framework.Consistently(t, claimGrace-graceMargin-time.Since(start), e.noWarnings("never", "late"),
		"no warning within the grace (%s)", claimGrace)
	e.waitEvent("never", v1.EventTypeWarning, "FailedAttachVolume",
		fmt.Sprintf("AttachVolume.Attach failed for volume %q : PersistentVolumeClaim %q not found", "scratch", e.ns+"/never-scratch"))
	if waited := time.Since(start); waited < claimGrace-timestampGranularity {
		t.Errorf("warned %v after the pod's creation, within the grace", waited)
	}
	if err := e.noWarnings("late")(); err != nil {
		t.Error(err)
	}
}

// kubelet writes its CSINode at start with every translatable plugin
// migrated, before its drivers register: a pod with an EBS volume there is
// not warned that the driver is missing while it may yet register, and is
// once it has been missing for the grace; a driver that registers within it
// gets the volume attached through CSI, its pod never warned.
func TestDriverNotRegisteredWarnedAfterGrace(t *testing.T) {
	e := newEnv(t, "drivergrace")
	const ebsDriver = "ebs.csi.aws.com"
	never := e.createNode("never", true)
	late := e.createNode("late", true)
	start := time.Now()
	e.createCSINode(never, []storagev1.CSINodeDriver{}, "kubernetes.io/aws-ebs")
	e.createCSINode(late, []storagev1.CSINodeDriver{}, "kubernetes.io/aws-ebs")
	e.startAttacher(ebsDriver, "")
	e.startController(nil)

	ebs := func(id string) v1.Volume {
		return v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: id}}}
	}
	neverID, lateID := e.name("vol-never"), e.name("vol-late")
	e.createPodObject(framework.Pod(e.ns, "never", never, ebs(neverID)))
	e.createPodObject(framework.Pod(e.ns, "late", late, ebs(lateID)))

	// The driver registers on one node, a moment later.
	framework.Consistently(t, 2*time.Second, e.noWarnings("never", "late"), "no warning right after the pods")
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cn, err := e.client.StorageV1().CSINodes().Get(e.ctx, late, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cn.Spec.Drivers = []storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-"+late)}
		_, err = e.client.StorageV1().CSINodes().Update(e.ctx, cn, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.waitAttached(ebsDriver, lateID, late)

	framework.Consistently(t, undecidedGrace-graceMargin-time.Since(start), e.noWarnings("never", "late"),
		"no warning within the grace (%s)", undecidedGrace)
	want := fmt.Sprintf("AttachVolume.Attach failed for volume %q : in-tree plugin kubernetes.io/aws-ebs is migrated on node %s but driver %s is not installed",
		"ebs", never, ebsDriver)
	framework.Eventually(t, waitTimeout+undecidedGrace, func() (bool, error) {
		warnings, err := e.warnings("never")
		return len(warnings) == 1 && strings.HasSuffix(warnings[0], want), err
	}, "pod never warned: %s", want)
	if waited := time.Since(start); waited < undecidedGrace-timestampGranularity {
		t.Errorf("warned %v after the CSINode's creation, within the grace", waited)
	}
	if err := e.noWarnings("late")(); err != nil {
		t.Error(err)
	}
}
