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
	volumeID := "vol-0e2e" + e.ns[len(e.ns)-4:]
	src := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: volumeID, FSType: "ext4"}}
	pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, "legacy", src)
	if err != nil {
		t.Fatal(err)
	}
	v := csiVolume{claim: "legacy", pv: pv.Name, driver: stack.EBSDriver, handle: volumeID}
	e.createPod("app", e.nodes[0], v.claim)

	e.waitAttached(v, e.nodes[0])

	e.deletePod("app")
	e.waitDetached(v, e.nodes[0])
}
