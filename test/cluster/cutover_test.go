package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// upstreamElection are kube-controller-manager's own leader election
// timings (kubeadm keeps them): a restarted kube-controller-manager waits
// for the Lease its predecessor kept, up to 15 s, as in production.
var upstreamElection = []string{"--leader-elect-lease-duration=15s", "--leader-elect-renew-deadline=10s", "--leader-elect-retry-period=2s"}

// TestCutOver follows docs/operations.md, "Switching from
// kube-controller-manager's controller" and "The way back", on a whole
// cluster with leader election on (kube-controller-manager and
// kube-scheduler elected, this controller as manifests/base deploys it: two
// replicas, its Lease, the Deployment's arguments) and pods running: a
// StatefulSet and a Deployment with generic ephemeral volumes, spread over
// four nodes in two zones.
//
// kube-controller-manager starts with --controllers=* and attaches every
// volume. The cut-over: the state is recorded (step 1), kube-controller-
// manager is restarted with --controllers=*,-attachdetach and its log says
// the controller is disabled (step 3), then this controller starts (step
// 4). Meanwhile, in the gap, pods are created (scaled up) and one is deleted:
// the new pods are scheduled, their claims provisioned and bound, but
// nothing attaches them and the deleted pod's volume stays attached until
// this controller leads. Then step 5: the new pods run, the deleted pod's
// volume is detached and deleted, the VolumeAttachments and node statuses of
// the pods that kept running are what step 1 recorded, the controller's
// metrics agree and its queues are empty, no FailedAttachVolume event, and
// pods created after the switch are attached by this controller (its attach
// counter). The way back, the same: this controller stopped (both replicas
// SIGTERMed, the leader hands over), pods created and deleted in the gap,
// kube-controller-manager restarted with --controllers=*, then the same
// checks, kube-controller-manager's log naming every volume it attached.
//
// Throughout, a DetachWatch fails the test at any moment a pod that kept
// running was disturbed (its VolumeAttachment deleted or detached, its
// volume dropped from its node's volumesAttached, the pod not Running or
// Ready, a container restarted), and the AttachmentWatch at any moment a
// volume was on two nodes.
func TestCutOver(t *testing.T) {
	fullSet(t)
	args, err := stack.ManifestControllerArgs()
	if err != nil {
		t.Fatal(err)
	}
	e := startCluster(t, stack.KubeControllerManager, stack.ClusterOptions{
		Nodes: 4, Zones: 2, LeaderElection: true, ControllerManagerArgs: upstreamElection,
	})
	// Timing lines name the scenario: both controllers take part.
	e.kind = "cut-over"
	guard, err := stack.WatchDetaches(e.ctx, e.c.Client)
	if err != nil {
		t.Fatal(err)
	}
	c := &cutOver{env: e, guard: guard, ns: e.namespace("cutover"), db: 4, cache: 3, known: map[types.UID]bool{}}

	e.step("workload running, kube-controller-manager attaching", func(ctx context.Context) error {
		if err := c.create(ctx); err != nil {
			return err
		}
		return c.settled(ctx, nil)
	})
	var before attachState
	e.step("1. record the state", func(ctx context.Context) (err error) {
		before, err = c.snapshot(ctx)
		return err
	})

	// The cut-over.
	gapStarted := time.Now()
	e.step("3. restart kube-controller-manager with -attachdetach", func(ctx context.Context) error {
		_, err := e.c.SwitchControllerManager(ctx, false)
		return err
	})
	var g gap
	e.step("gap: pods created and deleted, nothing attaches", func(ctx context.Context) (err error) {
		g, err = c.churn(ctx)
		return err
	})
	var replicas []*stack.Controller
	var leader *stack.Controller
	e.step("4. start this controller (2 replicas)", func(ctx context.Context) (err error) {
		replicas, leader, err = e.c.StartControllerReplicas(ctx, 2, args...)
		return err
	})
	t.Logf("gap with no attach/detach controller: %.2fs; the leader: %s", time.Since(gapStarted).Seconds(), logLine(leader.Process.Tail(1<<22), `"Recovered state"`))
	var attaches float64
	e.step("5. watch: gap's pods attached, deleted pod's volume detached", func(ctx context.Context) (err error) {
		if err := c.settled(ctx, &g); err != nil {
			return err
		}
		attaches, err = c.oursSettled(ctx, leader)
		return err
	})
	e.step("5. watch: state of running pods unchanged", func(ctx context.Context) error {
		return c.unchanged(ctx, before, g)
	})
	e.step("5. it acts: new pods attached by this controller", func(ctx context.Context) error {
		fresh, err := c.scaleUp(ctx)
		if err != nil {
			return err
		}
		after, err := c.oursSettled(ctx, leader)
		if err != nil {
			return err
		}
		if got := after - attaches; got != float64(len(fresh)) {
			return fmt.Errorf("this controller attached %v volumes, want the %d of the new pods %v", got, len(fresh), fresh)
		}
		return c.noFailedAttach(ctx)
	})

	// The way back.
	middle, err := c.snapshot(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	gapStarted = time.Now()
	e.step("back 1. stop this controller (both replicas)", func(ctx context.Context) error {
		if err := e.c.StopControllerReplicas(replicas, 2*time.Minute); err != nil {
			return err
		}
		if !strings.Contains(leader.Process.Tail(1<<22), `"Handed over`) {
			return fmt.Errorf("the leader did not log its handoff: %s", leader.Process.Tail(2048))
		}
		return nil
	})
	e.step("gap: pods created and deleted, nothing attaches", func(ctx context.Context) (err error) {
		g, err = c.churn(ctx)
		return err
	})
	e.step("back 2. restart kube-controller-manager with attachdetach", func(ctx context.Context) error {
		_, err := e.c.SwitchControllerManager(ctx, true)
		return err
	})
	t.Logf("gap with no attach/detach controller: %.2fs", time.Since(gapStarted).Seconds())
	e.step("back 3. watch: gap's pods attached, deleted pod's volume detached", func(ctx context.Context) error {
		if err := c.settled(ctx, &g); err != nil {
			return err
		}
		return c.attachedByKubeControllerManager(g.created)
	})
	e.step("back 3. watch: state of running pods unchanged", func(ctx context.Context) error {
		return c.unchanged(ctx, middle, g)
	})
	e.step("back 3. it acts: new pods attached by kube-controller-manager", func(ctx context.Context) error {
		fresh, err := c.scaleUp(ctx)
		if err != nil {
			return err
		}
		if err := c.attachedByKubeControllerManager(fresh); err != nil {
			return err
		}
		return c.noFailedAttach(ctx)
	})
	if err := guard.Err(); err != nil {
		t.Error(err)
	}
	pods, volumes := guard.Protected()
	t.Logf("%d pods and %d volumes guarded at the end, %d volumes watched, none detached, none on two nodes", pods, volumes, len(e.watch.Volumes()))
}

// cutOver is the workload of TestCutOver: the StatefulSet "db" and the
// Deployment "cache" (generic ephemeral volumes).
type cutOver struct {
	*env
	guard     *stack.DetachWatch
	ns        string
	db, cache int32
	// known are the pods seen running.
	known map[types.UID]bool
}

const (
	cutOverStatefulSet = "db"
	cutOverDeployment  = "cache"
)

// gap is what happened while no attach/detach controller ran: the PVs of
// the pods created, and the volumes of the pod deleted.
type gap struct {
	created []string
	deleted []ephemeralVolume
}

func (c *cutOver) create(ctx context.Context) error {
	sts := stack.StatefulSet(c.ns, cutOverStatefulSet, c.db, c.c.StorageClass)
	sts.Spec.PodManagementPolicy = "Parallel"
	if _, err := c.c.Client.AppsV1().StatefulSets(c.ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := c.c.Client.AppsV1().Deployments(c.ns).Create(ctx, stack.EphemeralDeployment(c.ns, cutOverDeployment, c.cache, c.c.StorageClass), metav1.CreateOptions{})
	return err
}

// running waits until both workloads run at their replicas with their
// volumes in place, and returns their pods.
func (c *cutOver) running(ctx context.Context) ([]v1.Pod, error) {
	db, err := stack.WaitStatefulSetRunning(ctx, c.c.Client, c.ns, cutOverStatefulSet, stepTimeout)
	if err != nil {
		return nil, err
	}
	cache, err := stack.WaitDeploymentRunning(ctx, c.c.Client, c.ns, cutOverDeployment, stepTimeout)
	if err != nil {
		return nil, err
	}
	pods := append(db, cache...)
	if len(pods) != int(c.db+c.cache) {
		return nil, fmt.Errorf("%d pods running, want %d", len(pods), c.db+c.cache)
	}
	return pods, c.checkPodVolumes(ctx, pods)
}

// settled waits until every pod runs with its volumes in place and, after
// a gap, the deleted pod's volume is detached and deleted; it then guards
// every running pod.
func (c *cutOver) settled(ctx context.Context, g *gap) error {
	pods, err := c.running(ctx)
	if err != nil {
		return err
	}
	if g != nil {
		if err := c.volumesDeleted(ctx, c.guard, g.deleted); err != nil {
			return err
		}
	}
	for _, p := range pods {
		if !c.known[p.UID] {
			if err := c.guard.Protect(ctx, p); err != nil {
				return err
			}
			c.known[p.UID] = true
		}
	}
	return nil
}

// churn is what users do while no attach/detach controller runs: a pod of
// the Deployment deleted (its replacement created), both workloads scaled
// up by one. It returns once the new pods are scheduled with their claims
// bound, and checks that nothing attached them, and that the deleted pod's
// volume is still attached: nothing detached it either.
func (c *cutOver) churn(ctx context.Context) (gap, error) {
	var g gap
	cache, err := stack.WaitDeploymentRunning(ctx, c.c.Client, c.ns, cutOverDeployment, stepTimeout)
	if err != nil {
		return g, err
	}
	victim := cache[0]
	if g.deleted, err = c.ephemeralVolumes(ctx, []v1.Pod{victim}); err != nil {
		return g, err
	}
	c.guard.Release(victim)
	if err := c.c.Client.CoreV1().Pods(c.ns).Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		return g, err
	}
	created, err := c.scaleUpBy1(ctx)
	if err != nil {
		return g, err
	}
	// The deleted pod's replacement, one more of each workload.
	want := 3
	var waiting []string
	ok := framework.Poll(c.t, stepTimeout, func() (bool, error) {
		pods, err := c.c.Client.CoreV1().Pods(c.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		g.created, waiting = nil, nil
		for _, p := range pods.Items {
			switch {
			case p.UID == victim.UID:
				waiting = append(waiting, "deleted pod "+p.Name+" still there")
			case c.known[p.UID]:
			case p.Spec.NodeName == "":
				waiting = append(waiting, p.Name+" not scheduled")
			case p.Status.Phase != v1.PodPending:
				return false, fmt.Errorf("pod %s %s while no attach/detach controller runs", p.Name, p.Status.Phase)
			default:
				pvs, why, err := c.boundPVs(ctx, &p)
				if err != nil {
					return false, err
				}
				if why != "" {
					waiting = append(waiting, why)
				}
				g.created = append(g.created, pvs...)
			}
		}
		return len(waiting) == 0 && len(g.created) == want, nil
	})
	if !ok {
		return g, fmt.Errorf("new pods (%d volumes of %d) not scheduled with claims bound after %s: %v", len(g.created), want, stepTimeout, waiting)
	}
	vas, err := c.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return g, err
	}
	for _, va := range vas.Items {
		if slices.Contains(g.created, pvOf(&va)) {
			return g, fmt.Errorf("PV %s attached to %s while no attach/detach controller runs", pvOf(&va), va.Spec.NodeName)
		}
	}
	for _, d := range g.deleted {
		if !slices.ContainsFunc(vas.Items, func(va storagev1.VolumeAttachment) bool { return va.Name == d.attached && va.DeletionTimestamp == nil }) {
			return g, fmt.Errorf("%s of the deleted pod detached while no attach/detach controller runs", d)
		}
	}
	c.t.Logf("gap: %s deleted, %v scaled up to %d and %d: new pods' PVs %v bound, none attached", victim.Name, created, c.db, c.cache, g.created)
	return g, nil
}

// boundPVs are the PVs of the pod's claims, once all are bound; else why
// not.
func (c *cutOver) boundPVs(ctx context.Context, pod *v1.Pod) ([]string, string, error) {
	var pvs []string
	for _, name := range stack.PodClaims(pod) {
		claim, err := c.c.Client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, "claim " + name + " not created", nil
		}
		if claim.Status.Phase != v1.ClaimBound {
			return nil, "claim " + name + " " + string(claim.Status.Phase), nil
		}
		pvs = append(pvs, claim.Spec.VolumeName)
	}
	return pvs, "", nil
}

// scaleUpBy1 scales both workloads up by one pod.
func (c *cutOver) scaleUpBy1(ctx context.Context) ([]string, error) {
	c.db++
	c.cache++
	if err := stack.ScaleStatefulSet(ctx, c.c.Client, c.ns, cutOverStatefulSet, c.db); err != nil {
		return nil, err
	}
	if err := stack.ScaleDeployment(ctx, c.c.Client, c.ns, cutOverDeployment, c.cache); err != nil {
		return nil, err
	}
	return []string{cutOverStatefulSet, cutOverDeployment}, nil
}

// scaleUp scales both workloads up by one, waits until the new pods run
// with their volumes in place, and returns the new pods' PVs.
func (c *cutOver) scaleUp(ctx context.Context) ([]string, error) {
	if _, err := c.scaleUpBy1(ctx); err != nil {
		return nil, err
	}
	pods, err := c.running(ctx)
	if err != nil {
		return nil, err
	}
	var fresh []string
	for _, p := range pods {
		if c.known[p.UID] {
			continue
		}
		pvs, why, err := c.boundPVs(ctx, &p)
		if err != nil || why != "" {
			return nil, fmt.Errorf("pod %s: %s%w", p.Name, why, err)
		}
		fresh = append(fresh, pvs...)
	}
	if len(fresh) != 2 {
		return nil, fmt.Errorf("new pods' PVs %v, want 2", fresh)
	}
	return fresh, c.settled(ctx, nil)
}

// attachState is what a cut-over must not change, by PV and node: the
// VolumeAttachment's name and UID, and whether the node's volumesAttached
// lists the volume.
type attachState map[string]attachment

type attachment struct {
	name   string
	uid    types.UID
	listed bool
}

// snapshot is the runbook's step 1: `kubectl get volumeattachments` and the
// nodes' volumesAttached.
func (c *cutOver) snapshot(ctx context.Context) (attachState, error) {
	vas, err := c.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	nodes, err := c.c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pvs, err := c.c.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pvOfName := map[v1.UniqueVolumeName]string{}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil {
			pvOfName[v1.UniqueVolumeName(framework.CSIVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle))] = pv.Name
		}
	}
	s := attachState{}
	for _, va := range vas.Items {
		s[pvOf(&va)+" on "+va.Spec.NodeName] = attachment{name: va.Name, uid: va.UID}
	}
	for _, n := range nodes.Items {
		for _, a := range n.Status.VolumesAttached {
			key := pvOfName[a.Name] + " on " + n.Name
			got := s[key]
			got.listed = true
			s[key] = got
		}
	}
	return s, nil
}

// unchanged is the runbook's diff: the state now is the state recorded,
// but for the volumes of the pods created or deleted in the gap.
func (c *cutOver) unchanged(ctx context.Context, before attachState, g gap) error {
	now, err := c.snapshot(ctx)
	if err != nil {
		return err
	}
	changed := append(slices.Clone(g.created), ephemeralPVs(g.deleted)...)
	keep := func(s attachState) attachState {
		out := attachState{}
		for k, v := range s {
			if pv, _, _ := strings.Cut(k, " on "); !slices.Contains(changed, pv) {
				out[k] = v
			}
		}
		return out
	}
	b, a := keep(before), keep(now)
	if !maps.Equal(b, a) {
		return fmt.Errorf("VolumeAttachments or node status of running pods changed:\nbefore %v\nafter  %v", b, a)
	}
	for k, v := range a {
		if v.name == "" || !v.listed {
			return fmt.Errorf("%s: VolumeAttachment %q, listed in node status %t: want both", k, v.name, v.listed)
		}
	}
	c.t.Logf("%d attachments of running pods unchanged (names, UIDs, node status)", len(a))
	return nil
}

func ephemeralPVs(vs []ephemeralVolume) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.pv)
	}
	return out
}

// oursSettled waits until the leader's metrics show every volume of the
// running pods desired and attached, and its queues empty (the runbook's
// step 5), and returns its count of successful attaches.
func (c *cutOver) oursSettled(ctx context.Context, leader *stack.Controller) (float64, error) {
	volumes := float64(c.db + c.cache)
	plugin := "kubernetes.io/csi:" + stack.MockDriver
	var attaches float64
	var last string
	ok := framework.Poll(c.t, stepTimeout, func() (bool, error) {
		m, err := leader.Metrics(ctx)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		desired := m.Sum("attachdetach_controller_total_volumes", map[string]string{"plugin_name": plugin, "state": "desired_state_of_world"})
		actual := m.Sum("attachdetach_controller_total_volumes", map[string]string{"plugin_name": plugin, "state": "actual_state_of_world"})
		var depth float64
		for _, q := range []string{"volumes", "nodestatus", "pods"} {
			depth += m.Sum("workqueue_depth", map[string]string{"name": q})
		}
		attaches = m.Sum("storage_operation_duration_seconds_count", map[string]string{"operation_name": "volume_attach", "status": "success"})
		last = fmt.Sprintf("desired %v, actual %v, queued %v", desired, actual, depth)
		return desired == volumes && actual == volumes && depth == 0, nil
	})
	if !ok {
		return 0, fmt.Errorf("metrics of this controller not settled at %v volumes: %s", volumes, last)
	}
	return attaches, nil
}

// attachedByKubeControllerManager checks that the running
// kube-controller-manager's log says it attached each PV.
func (c *cutOver) attachedByKubeControllerManager(pvs []string) error {
	log := c.c.ControllerManager.Tail(1 << 24)
	for _, pv := range pvs {
		if !strings.Contains(log, `AttachVolume.Attach succeeded for volume "`+pv+`"`) {
			return fmt.Errorf("kube-controller-manager's log (%s) does not say it attached %s", c.c.ControllerManager.LogPath, pv)
		}
	}
	return nil
}

// noFailedAttach is the runbook's check of events: no FailedAttachVolume.
func (c *cutOver) noFailedAttach(ctx context.Context) error {
	events, err := c.c.Client.CoreV1().Events(c.ns).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("reason", "FailedAttachVolume").String(),
	})
	if err != nil {
		return err
	}
	if n := len(events.Items); n > 0 {
		return fmt.Errorf("%d FailedAttachVolume events, first: %s: %s", n, events.Items[0].InvolvedObject.Name, events.Items[0].Message)
	}
	return nil
}

// logLine is the last line of log holding s, "" if none.
func logLine(log, s string) string {
	var found string
	for line := range strings.Lines(log) {
		if strings.Contains(line, s) {
			found = strings.TrimSpace(line)
		}
	}
	return found
}
