package e2e

import (
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// awsEBSPlugin is the in-tree plugin whose volumes the nodes migrate to
// stack.EBSDriver.
const awsEBSPlugin = "kubernetes.io/aws-ebs"

// TestMigratedVolume: an in-tree AWS EBS volume on nodes that migrate the
// plugin is attached through a VolumeAttachment for the EBS CSI driver, which
// the real external-attacher translates and attaches, and is reported under
// its CSI name; it is detached the same way.
func TestMigratedVolume(t *testing.T) {
	e := newEnv(t, "migrated", 1, awsEBSPlugin)
	v := e.createEBSVolume("legacy")
	e.createPod("app", e.nodes[0], v.claim)

	e.waitAttached(v, e.nodes[0])

	e.deletePod("app")
	e.waitDetached(v, e.nodes[0])
}

// createEBSVolume creates a claim bound to an in-tree awsElasticBlockStore
// PV, which the external-attacher of stack.EBSDriver attaches once migrated.
func (e *env) createEBSVolume(claim string) csiVolume {
	e.t.Helper()
	volumeID := "vol-0e2e" + e.ns[len(e.ns)-4:]
	src := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: volumeID, FSType: "ext4"}}
	pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, claim, src)
	if err != nil {
		e.t.Fatal(err)
	}
	return csiVolume{claim: claim, pv: pv.Name, driver: stack.EBSDriver, handle: volumeID}
}
