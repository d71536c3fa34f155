package e2e

import (
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestMultiAttachHandover: a ReadWriteOnce volume wanted on a second node
// waits, with a "Waiting for detach" warning, until the first pod is gone and
// the volume detached from its node; then it is attached to the second. It is
// never attached to both at once.
func TestMultiAttachHandover(t *testing.T) {
	e := newEnv(t, "handover", 2)
	rec := e.recordVolumeAttachments()
	v := e.createVolume("data")
	e.createPod("first", e.nodes[0], v.claim)
	e.waitAttached(v, e.nodes[0])

	e.createPod("second", e.nodes[1], v.claim)
	if got, want := e.waitEvent("second", "FailedAttachVolume", fmt.Sprintf("for volume %q", v.pv)), framework.WaitingForDetachUsedBy(v.pv, "first"); got != want {
		t.Errorf("pod second told %q, want %q", got, want)
	}
	expl, raw, err := e.controller.Explain(e.ctx, e.ns+"/second")
	if err != nil {
		t.Fatal(err)
	}
	if len(expl) != 1 || expl[0].Node != e.nodes[1] || expl[0].Volume != v.name() || !strings.Contains(expl[0].Reason, e.nodes[0]) {
		t.Errorf("/explain?pod=%s/second: want one volume %s on %s, blocked by node %s; got %s", e.ns, v.name(), e.nodes[1], e.nodes[0], raw)
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(e.nodes[1]), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("VolumeAttachment of the second node exists while the first holds the volume (err %v)", err)
	}

	e.deletePod("first")
	e.waitDetached(v, e.nodes[0])
	e.waitAttached(v, e.nodes[1])

	rec.check(t)
	if n := rec.maxLiveOf(v.pv); n != 1 {
		t.Errorf("%d VolumeAttachments of %s were live at once, want 1", n, v.pv)
	}
}
