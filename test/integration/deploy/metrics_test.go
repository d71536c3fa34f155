package deploy

import (
	"net/http"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestMetricsCatalogue makes the controller do what each of its metrics
// counts (attach, a failing attach, an in-tree volume migrated to CSI, a
// forced detach, a detach), then compares /metrics with docs/metrics.md both
// ways: every served family is documented, with its type and labels, and
// every documented family was served.
func TestMetricsCatalogue(t *testing.T) {
	r := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, r)
	s := newScene(t, "metrics", "fail-")
	c := startController(t, r, kubeconfig, nil)
	waitStarted(t, c)

	attached := s.volume("attached", "ok-1")
	s.createPod(attached)
	s.waitAttached(attached)
	s.waitReported(attached, true)

	failing := s.volume("failing", "fail-1")
	s.createPod(failing)
	waitMetric(t, c, "attachdetach_controller_attach_errors_total{")

	// An EBS volume on a node whose CSINode says the plugin is migrated:
	// attached through the EBS CSI driver.
	if _, err := framework.CreateCSINode(s.ctx, s.client, s.node,
		[]storagev1.CSINodeDriver{framework.CSINodeDriver("ebs.csi.aws.com", "i-0123")}, "kubernetes.io/aws-ebs"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Client.StorageV1().CSINodes().Delete(t.Context(), s.node, metav1.DeleteOptions{}) })
	ebs := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-" + s.ns}}
	if _, _, err := framework.CreateBoundPVC(s.ctx, s.client, s.ns, "migrated", ebs); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreatePod(s.ctx, s.client, s.ns, "migrated", s.node, "migrated"); err != nil {
		t.Fatal(err)
	}
	waitMetric(t, c, `attachdetach_controller_mechanism_decisions_total{mechanism="csi",plugin_name="kubernetes.io/aws-ebs"}`)

	// Still mounted on a node tainted out-of-service: detached at once.
	s.setInUse(s.node, attached)
	taintOutOfService(t, s.node)
	s.deletePod(attached)
	s.waitDetached(attached)
	waitMetric(t, c, `attach_detach_controller_attachdetach_controller_forced_detaches{reason="out-of-service"}`)

	s.deletePod(failing)
	s.waitDetached(failing)

	_, body, err := c.Get(t.Context(), "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	served, err := parseExposition(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range compareCatalogue(served, readCatalogue(t), true) {
		t.Error(p)
	}
	stopController(t, c)
}

// waitMetric waits until /metrics serves a line starting with prefix.
func waitMetric(t *testing.T, c *framework.Controller, prefix string) {
	t.Helper()
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		code, body, err := c.Get(t.Context(), "/metrics")
		if err != nil || code != http.StatusOK {
			return false, nil
		}
		for line := range strings.Lines(body) {
			if strings.HasPrefix(line, prefix) {
				return true, nil
			}
		}
		return false, nil
	}, "/metrics to serve %s", prefix)
}

// taintOutOfService adds node.kubernetes.io/out-of-service, as an operator
// does to a node that is shut down for good.
func taintOutOfService(t *testing.T, node string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(t.Context(), node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute})
		_, err = cluster.Client.CoreV1().Nodes().Update(t.Context(), n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
