package migration

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// With --csi-migration=completed, as kube-controller-manager v1.37, an
// awsElasticBlockStore volume is attached through ebs.csi.aws.com on a node
// that has no CSINode (nor CSINodeInfo) at all: at once, without waiting.
func TestCompletedMigrationPolicy(t *testing.T) {
	const (
		ns     = "mig-completed"
		node   = "mig-completed-node"
		handle = "vol-completed"
	)
	setup(t, ns)
	ctx := t.Context()
	createNode(t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t, func(o *app.Options) { o.CSIMigration = "completed" })

	pv := createBoundPV(t, ns, "claim", ebsSource(handle))
	createPod(t, ns, "pod", node, framework.PVCVolumes("claim")...)
	created := time.Now()

	name := framework.VolumeAttachmentName(handle, ebsDriver, node)
	framework.Eventually(t, 10*time.Second, func() (bool, error) {
		va, err := getVA(ctx, name)
		return va != nil, err
	}, "VolumeAttachment %s on a node without CSINode", name)
	if latency := time.Since(created); latency >= 5*time.Second {
		t.Errorf("VolumeAttachment appeared %s after the pod, want < 5s", latency)
	} else {
		t.Logf("VolumeAttachment appeared %s after the pod", latency)
	}
	va := waitAttachedVA(t, name)
	if va.Spec.Attacher != ebsDriver || va.Spec.NodeName != node {
		t.Errorf("spec = {attacher %q, nodeName %q}, want {%q, %q}", va.Spec.Attacher, va.Spec.NodeName, ebsDriver, node)
	}
	if src := va.Spec.Source; src.PersistentVolumeName == nil || *src.PersistentVolumeName != pv.Name {
		t.Errorf("spec.source = %+v, want persistentVolumeName %s", src, pv.Name)
	}
	waitListed(t, node, framework.CSIVolumeName(ebsDriver, handle), true)
	if err := attachedExactly(ctx, node, framework.CSIVolumeName(ebsDriver, handle)); err != nil {
		t.Error(err)
	}
	if msg, err := podEvent(ctx, ns, "pod", v1.EventTypeWarning); err != nil || msg != "" {
		t.Errorf("Warning on the pod: %q (err %v), want none", msg, err)
	}
	if v := ctrl.mustMetric(t, waitingMetric, nil); v != 0 {
		t.Errorf("%s = %v, want 0: nothing waits for node information", waitingMetric, v)
	}
	if v := ctrl.mustMetric(t, decisionsMetric, map[string]string{"plugin_name": ebsPlugin, "mechanism": "pending"}); v != 0 {
		t.Errorf("%s{mechanism=\"pending\"} = %v, want 0", decisionsMetric, v)
	}
}
