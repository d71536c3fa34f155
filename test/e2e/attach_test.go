package e2e

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// TestAttachAndDetach: pods' volumes are attached by the real
// external-attacher, reported in node status and mounted; a deleted pod's
// volume is unmounted, then detached, and only that one.
func TestAttachAndDetach(t *testing.T) {
	e := newEnv(t, "attach", 2)
	a := e.createVolume("a")
	b := e.createVolume("b")
	e.createPod("pod-a", e.nodes[0], a.claim)
	e.createPod("pod-b", e.nodes[1], b.claim)

	e.waitAttached(a, e.nodes[0])
	vaB := e.waitAttached(b, e.nodes[1])
	e.waitEvent("pod-a", "SuccessfulAttachVolume", `AttachVolume.Attach succeeded for volume "`+a.pv+`"`)

	e.deletePod("pod-a")
	e.waitPodGone("pod-a")
	e.waitDetached(a, e.nodes[0])

	// pod-b's volume was not touched.
	got, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaB.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.UID != vaB.UID || got.DeletionTimestamp != nil || !attachedBy(got, b.driver) {
		t.Errorf("VolumeAttachment %s of pod-b changed: uid %s -> %s, deletionTimestamp %v, attached %v",
			vaB.Name, vaB.UID, got.UID, got.DeletionTimestamp, got.Status.Attached)
	}
	e.waitAttached(b, e.nodes[1])

	// A pod whose claim does not exist: /explain says why nothing is
	// attached for it, as its event does; once deleted, that it is gone.
	e.createPod("pod-lost", e.nodes[0], "no-such-claim")
	e.waitEvent("pod-lost", "FailedAttachVolume", `PersistentVolumeClaim "`+e.ns+`/no-such-claim" not found`)
	expl, raw, err := e.controller.Explain(e.ctx, e.ns+"/pod-lost")
	if err != nil {
		t.Fatal(err)
	}
	if len(expl) != 1 || expl[0].PodVolume == "" || expl[0].Action != "nothing" ||
		!strings.Contains(expl[0].Reason, `PersistentVolumeClaim "`+e.ns+`/no-such-claim" not found`) {
		t.Errorf("/explain?pod=%s/pod-lost: want its volume, nothing done, the claim not found; got %s", e.ns, raw)
	}
	e.deletePod("pod-lost")
	e.waitPodGone("pod-lost")
	e.eventually(func() (bool, error) {
		expl, _, err := e.controller.Explain(e.ctx, e.ns+"/pod-lost")
		return err == nil && len(expl) == 1 && strings.HasPrefix(expl[0].Reason, "no pod "+e.ns+"/pod-lost"), err
	}, "/explain?pod=%s/pod-lost says the pod is gone", e.ns)

	// Dashboards count attaches and detaches with this histogram.
	for op, want := range map[string]float64{"volume_attach": 2, "volume_detach": 1} {
		e.eventually(func() (bool, error) {
			m, err := e.controller.Metrics(e.ctx)
			if err != nil {
				return false, err
			}
			return m.Sum("storage_operation_duration_seconds_count", map[string]string{
				"operation_name": op, "status": "success", "volume_plugin": "kubernetes.io/csi:" + stack.MockDriver,
			}) == want, nil
		}, "storage_operation_duration_seconds_count{operation_name=%q,status=\"success\"} = %v", op, want)
	}
}
