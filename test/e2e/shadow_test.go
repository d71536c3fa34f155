package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/shadow"
	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// shadowGrace is the shadow's --shadow-grace-period here: longer than
// kube-controller-manager and the external-attacher take on a loaded
// machine.
const shadowGrace = 10 * time.Second

// TestShadowOnTheWorkload runs the real kube-controller-manager (its
// attachdetach controller) and this controller in shadow mode on the demo's
// workload, with the real external-attacher and simulated kubelets: volumes
// of pods on three nodes, a ReadWriteMany volume on two nodes, a migrated
// in-tree EBS volume, and a ReadWriteOnce volume that moves from one node to
// another, then every pod deleted. The shadow reports every disagreement
// with what kube-controller-manager does that lasts its grace period; on
// this workload, with the defaults, there is none.
func TestShadowOnTheWorkload(t *testing.T) {
	e := newEnvWithoutController(t, "shadow", 3, awsEBSPlugin)
	// Every claim before kube-controller-manager starts, so that its initial
	// list holds them: it resolves a pod's claim and PV from its informers
	// when the pod comes, and a pod that comes ahead of its PV is left until
	// its relist of every pod, every 3 minutes (no PV event brings it back).
	var own []csiVolume
	for i := range e.nodes {
		own = append(own, e.createVolume("own-"+string(rune('a'+i))))
	}
	shared := e.createVolume("shared", v1.ReadWriteMany)
	legacy := e.createEBSVolume("legacy")
	data := e.createVolume("data")

	kcm, err := st.StartKubeControllerManager(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- last lines of %s:\n%s", kcm.Name, kcm.Tail(logTail))
		}
		if err := kcm.Stop(stack.StopGrace); err != nil {
			t.Error(err)
		}
	})
	e.startController("--shadow", "--shadow-grace-period="+shadowGrace.String())

	// Pods with their own volumes on every node.
	for i, node := range e.nodes {
		e.createPod(own[i].claim, node, own[i].claim)
	}
	// A ReadWriteMany volume on two nodes.
	e.createPod("shared-0", e.nodes[0], shared.claim)
	e.createPod("shared-1", e.nodes[1], shared.claim)
	// A migrated in-tree EBS volume.
	e.createPod("legacy", e.nodes[2], legacy.claim)
	// A ReadWriteOnce volume wanted on two nodes.
	e.createPod("first", e.nodes[0], data.claim)

	for i, v := range own {
		e.waitAttached(v, e.nodes[i])
	}
	e.waitAttached(shared, e.nodes[0])
	e.waitAttached(shared, e.nodes[1])
	e.waitAttached(legacy, e.nodes[2])
	e.waitAttached(data, e.nodes[0])
	// The shadow sees what kube-controller-manager did, and agrees.
	e.eventually(func() (bool, error) {
		_, raw, err := e.controller.Explain(e.ctx, e.ns+"/legacy")
		return err == nil && strings.Contains(raw, `"action": "nothing"`) &&
			strings.Contains(raw, `"cluster": "attached, in node.status.volumesAttached"`) && !strings.Contains(raw, `"disagreement"`), err
	}, "/explain of pod legacy: attached in the cluster, nothing to do, no disagreement")

	// It moves: the second pod waits until the first is gone.
	// kube-controller-manager tells it why in the words this controller
	// uses (TestMultiAttachHandover holds ours to the same text).
	e.createPod("second", e.nodes[1], data.claim)
	if got, want := e.waitEvent("second", "FailedAttachVolume", fmt.Sprintf("for volume %q", data.pv)), framework.WaitingForDetachUsedBy(data.pv, "first"); got != want {
		t.Errorf("kube-controller-manager told pod second %q, want %q (the words this controller uses)", got, want)
	}
	e.deletePod("first")
	e.waitDetached(data, e.nodes[0])
	e.waitAttached(data, e.nodes[1])
	e.waitSettled()

	// Everything goes.
	for _, pod := range []string{"own-a", "own-b", "own-c", "shared-0", "shared-1", "legacy", "second"} {
		e.deletePod(pod)
	}
	for i, v := range own {
		e.waitDetached(v, e.nodes[i])
	}
	e.waitDetached(shared, e.nodes[0])
	e.waitDetached(shared, e.nodes[1])
	e.waitDetached(legacy, e.nodes[2])
	e.waitDetached(data, e.nodes[1])
	report := e.waitSettled()

	for _, kind := range shadow.Kinds() {
		if report.Opened[kind] != 0 {
			t.Errorf("%d %s disagreements with kube-controller-manager, want none", report.Opened[kind], kind)
		}
	}
	for _, d := range append(report.Oldest, report.Closed...) {
		t.Errorf("disagreement: %s %s on %s, pods %v: ours %q, cluster %q", d.Kind, d.Volume, d.Node, d.Pods, d.Ours, d.Cluster)
	}
	m, err := e.controller.Metrics(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Sum("attachdetach_controller_shadow_refused_writes_total", nil); n != 0 {
		t.Errorf("the shadow tried %v writes, want none", n)
	}
}

// waitSettled waits until the shadow has no disagreement pending (each one
// younger than the grace period is either gone or reported) and returns its
// report.
func (e *env) waitSettled() shadow.Summary {
	e.t.Helper()
	var report shadow.Summary
	var raw string
	framework.Eventually(e.t, waitTimeout+2*shadowGrace, func() (bool, error) {
		var err error
		report, raw, err = e.controller.ShadowReport(e.ctx)
		return err == nil && report.Pending == 0, err
	}, "no shadow disagreement pending")
	e.t.Logf("shadow report: %s", raw)
	return report
}
