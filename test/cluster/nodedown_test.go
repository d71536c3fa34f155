package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Nodes that stop, handled by the real node lifecycle of
// kube-controller-manager (stack.NodeLifecycle: NotReady 20 s after the
// kubelet's last Lease renewal, the unreachable NoExecute taint, pods evicted
// 30 s later), its taint eviction controller and its pod garbage collector.
// An evicted pod on a node without a kubelet never finishes terminating: it
// stays, still using its volume, until someone force-deletes it or the
// operator taints the node out of service.

const (
	// upstreamMaxWait is the max wait for unmount: kube-controller-manager's
	// (fixed) and this controller's default (--max-wait-for-unmount). A
	// volume still mounted on an unhealthy node is force-detached once it
	// has been unwanted that long.
	upstreamMaxWait = 6 * time.Minute
	// holdMargin is how long past upstreamMaxWait a test waits for a
	// forced detach, or makes sure none came.
	holdMargin = 45 * time.Second

	metricForced         = "attach_detach_controller_attachdetach_controller_forced_detaches"
	metricDisruptedZones = "attachdetach_controller_disrupted_zones"
	metricHeld           = "attachdetach_controller_forced_detaches_held"
)

// TestNodeDown: a node stopped for good (its kubelet and its CSI driver),
// a StatefulSet's pod on it.
//
// out-of-service (the small set, this controller; the full set adds the
// control): once the node is NotReady the operator taints it
// node.kubernetes.io/out-of-service; the taint eviction controller deletes
// the pod, the pod garbage collector force-deletes it, its volume, still in
// the stopped node's volumesInUse, is detached at once (a forced detach,
// reason out-of-service) and the StatefulSet's new pod runs on another node
// with it. Nothing is detached before the taint.
//
// evicted (the full set): two StatefulSets' pods on the node, left to the
// node lifecycle: both evicted, both stuck Terminating. The operator
// force-deletes one (kubectl delete --force): its volume, still mounted as
// far as the node says, is force-detached once the max wait for unmount has
// passed (6 minutes, not sooner) and its new pod runs elsewhere. The other,
// still Terminating, keeps its volume attached 6 minutes 45 s after its
// eviction and on: a pod that has not terminated is never force-detached
// by timeout. The out-of-service taint then frees it at once.
//
// Each runs with both controllers side by side; at no moment is a volume
// attached to two nodes.
func TestNodeDown(t *testing.T) {
	t.Run("out-of-service", func(t *testing.T) { sideBySide(t, nodeOutOfService) })
	t.Run("evicted", func(t *testing.T) {
		fullSet(t)
		sideBySide(t, nodeEvicted)
	})
}

func nodeOutOfService(t *testing.T, kind stack.AttachDetach, f *figures) {
	e := startCluster(t, kind, stack.ClusterOptions{Nodes: 3})
	detaches := e.watchDetaches()
	ns := e.namespace("oos")
	const name = "db"
	var pod v1.Pod
	e.step("create with 1 replica", func(ctx context.Context) error {
		pods, err := e.createStatefulSet(ctx, stack.StatefulSet(ns, name, 1, e.c.StorageClass))
		if err == nil {
			pod = pods[0]
		}
		return err
	})
	down := pod.Spec.NodeName
	pv, unique := e.volume(ns, stack.StatefulSetClaim(name, 0))
	created := time.Now()

	stopped := time.Now()
	if err := e.c.Node(down).Stop(); err != nil {
		t.Fatal(err)
	}
	f.dur(kind, "node stopped: NotReady", e.stepFrom(stopped, "node "+down+" stopped: NotReady", func(ctx context.Context) error {
		return stack.WaitNodeNotReady(ctx, e.c.Client, down, stepTimeout)
	}))

	tainted := time.Now()
	if err := stack.TaintNode(e.ctx, e.c.Client, down, stack.OutOfServiceTaint); err != nil {
		t.Fatal(err)
	}
	f.dur(kind, "out-of-service taint: pod force-deleted", e.stepFrom(tainted, "out-of-service: db-0 force-deleted", func(ctx context.Context) error {
		return stack.WaitPodGone(ctx, e.c.Client, ns, pod.Name, pod.UID, stepTimeout)
	}))
	f.dur(kind, "out-of-service taint: VolumeAttachment gone", e.stepAt(tainted, "out-of-service: volume detached", func(ctx context.Context) (time.Time, error) {
		return e.waitDetach(ctx, detaches, stack.DetachDone, pv, down, tainted, stepTimeout)
	}))
	f.dur(kind, "out-of-service taint: new pod Running elsewhere", e.stepFrom(tainted, "out-of-service: db-0 Running elsewhere", func(ctx context.Context) error {
		return e.movedAway(ctx, ns, name, pod, down)
	}))

	if early := detaches.Events(created, down); slices.ContainsFunc(early, func(d stack.DetachEvent) bool { return d.At.Before(tainted) }) {
		t.Errorf("detached from %s before the out-of-service taint: %v", down, early)
	}
	e.checkForced(f, map[string]int{"out-of-service": 1})
	t.Logf("volume %s (%s) moved off the stopped node %s", pv, unique, down)
}

func nodeEvicted(t *testing.T, kind stack.AttachDetach, f *figures) {
	e := startCluster(t, kind, stack.ClusterOptions{Nodes: 3})
	detaches := e.watchDetaches()
	ns := e.namespace("evicted")
	down := e.c.Nodes[0].Name
	// stuck is left to the node lifecycle; forced's pod is force-deleted
	// by the operator once evicted.
	const stuck, forced = "stuck", "forced"
	pods := map[string]v1.Pod{}
	e.step("create stuck and forced on "+down, func(ctx context.Context) error {
		for _, name := range []string{stuck, forced} {
			sts := stack.StatefulSet(ns, name, 1, e.c.StorageClass)
			preferNode(sts, down)
			got, err := e.createStatefulSet(ctx, sts)
			if err != nil {
				return err
			}
			if got[0].Spec.NodeName != down {
				return fmt.Errorf("pod %s on %s, want %s (preferred)", got[0].Name, got[0].Spec.NodeName, down)
			}
			pods[name] = got[0]
		}
		return nil
	})
	stuckPV, _ := e.volume(ns, stack.StatefulSetClaim(stuck, 0))
	forcedPV, forcedName := e.volume(ns, stack.StatefulSetClaim(forced, 0))

	stopped := time.Now()
	if err := e.c.Node(down).Stop(); err != nil {
		t.Fatal(err)
	}
	f.dur(kind, "node stopped: NotReady", e.stepFrom(stopped, "node "+down+" stopped: NotReady", func(ctx context.Context) error {
		return stack.WaitNodeNotReady(ctx, e.c.Client, down, stepTimeout)
	}))
	f.dur(kind, "node stopped: tainted unreachable:NoExecute", e.stepFrom(stopped, "tainted unreachable:NoExecute", func(ctx context.Context) error {
		return stack.WaitNodeTaint(ctx, e.c.Client, down, v1.TaintNodeUnreachable, v1.TaintEffectNoExecute, true, stepTimeout)
	}))
	f.dur(kind, "node stopped: both pods evicted (Terminating)", e.stepFrom(stopped, "both pods evicted, Terminating", func(ctx context.Context) error {
		for _, p := range pods {
			if _, err := stack.WaitPodTerminating(ctx, e.c.Client, ns, p.Name, p.UID, stepTimeout); err != nil {
				return err
			}
		}
		return nil
	}))
	evicted := time.Now()

	forcedAt := time.Now()
	if err := stack.ForceDeletePod(e.ctx, e.c.Client, ns, pods[forced].Name, pods[forced].UID); err != nil {
		t.Fatal(err)
	}
	d := e.stepAt(forcedAt, "forced-0 force-deleted: detach started", func(ctx context.Context) (time.Time, error) {
		return e.waitDetach(ctx, detaches, stack.DetachRequested, forcedPV, down, stopped, upstreamMaxWait+holdMargin)
	})
	f.dur(kind, "force-deleted pod: detach started (max wait 6m)", d)
	if kind == stack.Ours && d < upstreamMaxWait {
		t.Errorf("volume %s (%s) of the force-deleted pod detached from %s %s after the delete, before the max wait for unmount (%s)",
			forcedPV, forcedName, down, d.Round(time.Millisecond), upstreamMaxWait)
	}
	f.dur(kind, "force-deleted pod: new pod Running elsewhere", e.stepFrom(forcedAt, "forced-0 Running elsewhere", func(ctx context.Context) error {
		return e.movedAway(ctx, ns, forced, pods[forced], down)
	}))

	// stuck-0 has not terminated: wanted, never force-detached by timeout,
	// however long past the max wait.
	holdUntil := evicted.Add(upstreamMaxWait + holdMargin)
	e.stepFrom(evicted, fmt.Sprintf("stuck-0 Terminating, attached %s on", upstreamMaxWait+holdMargin), func(ctx context.Context) error {
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		for {
			if got := detaches.Events(stopped, down); slices.ContainsFunc(got, func(d stack.DetachEvent) bool { return d.Volume == stuckPV }) {
				return fmt.Errorf("volume %s of the Terminating pod detached from %s: %v", stuckPV, down, got)
			}
			if !time.Now().Before(holdUntil) {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ticker.C:
			}
		}
		if _, err := stack.WaitPodTerminating(ctx, e.c.Client, ns, pods[stuck].Name, pods[stuck].UID, time.Second); err != nil {
			return err
		}
		return e.attachedTo(ctx, stuckPV, down)
	})
	f.dur(kind, "Terminating pod: volume still attached, evicted since", time.Since(evicted))
	if kind == stack.Ours {
		ex, _, err := e.c.Controller.Explain(e.ctx, ns+"/"+pods[stuck].Name)
		if err != nil {
			t.Error(err)
		}
		for _, x := range ex {
			t.Logf("explain %s/%s: %s on %s: %s: %s", ns, pods[stuck].Name, x.Volume, x.Node, x.Action, x.Reason)
		}
	}

	tainted := time.Now()
	if err := stack.TaintNode(e.ctx, e.c.Client, down, stack.OutOfServiceTaint); err != nil {
		t.Fatal(err)
	}
	f.dur(kind, "out-of-service taint: Terminating pod force-deleted", e.stepFrom(tainted, "out-of-service: stuck-0 force-deleted", func(ctx context.Context) error {
		return stack.WaitPodGone(ctx, e.c.Client, ns, pods[stuck].Name, pods[stuck].UID, stepTimeout)
	}))
	f.dur(kind, "out-of-service taint: its VolumeAttachment gone", e.stepAt(tainted, "out-of-service: volume detached", func(ctx context.Context) (time.Time, error) {
		return e.waitDetach(ctx, detaches, stack.DetachDone, stuckPV, down, tainted, stepTimeout)
	}))
	f.dur(kind, "out-of-service taint: its new pod Running elsewhere", e.stepFrom(tainted, "out-of-service: stuck-0 Running elsewhere", func(ctx context.Context) error {
		return e.movedAway(ctx, ns, stuck, pods[stuck], down)
	}))
	e.checkForced(f, map[string]int{"timeout": 1, "out-of-service": 1})
	e.logDetaches(detaches, stopped)
}

// sideBySide runs scenario with this controller and with
// kube-controller-manager's attachdetach controller at the same time, each
// in a cluster of its own: the long scenarios spend their minutes waiting
// on the node lifecycle's clocks, not on the machine. In the small set
// (-short) only this controller runs. Once both are done, the figures each
// recorded are logged side by side ("figure" lines).
func sideBySide(t *testing.T, scenario func(t *testing.T, kind stack.AttachDetach, f *figures)) {
	f := &figures{vals: map[string]map[stack.AttachDetach]string{}}
	t.Cleanup(func() { f.log(t) })
	for _, kind := range []stack.AttachDetach{stack.Ours, stack.KubeControllerManager} {
		t.Run(string(kind), func(t *testing.T) {
			if kind == stack.KubeControllerManager && testing.Short() {
				t.Skip("the control run is in the full set: make test-cluster-full")
			}
			t.Parallel()
			scenario(t, kind, f)
		})
	}
}

// figures are what each controller's run measured, by what.
type figures struct {
	mu    sync.Mutex
	order []string
	vals  map[string]map[stack.AttachDetach]string
}

func (f *figures) add(kind stack.AttachDetach, what, format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vals[what] == nil {
		f.vals[what] = map[stack.AttachDetach]string{}
		f.order = append(f.order, what)
	}
	f.vals[what][kind] = fmt.Sprintf(format, args...)
}

func (f *figures) dur(kind stack.AttachDetach, what string, d time.Duration) {
	f.add(kind, what, "%.1fs", d.Seconds())
}

func (f *figures) log(t *testing.T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, what := range f.order {
		v := f.vals[what]
		t.Logf("figure %-52s %s %-10s %s %s", what+":", stack.Ours, or(v[stack.Ours], "-"), stack.KubeControllerManager, or(v[stack.KubeControllerManager], "-"))
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// stepFrom is step timed from origin, an event some steps before: it
// returns and logs the time since origin.
func (e *env) stepFrom(origin time.Time, what string, f func(ctx context.Context) error) time.Duration {
	e.t.Helper()
	if err := f(e.ctx); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	d := time.Since(origin)
	e.t.Logf("timing %s %-40s %6.2fs (since %s)", e.kind, what+":", d.Seconds(), origin.Format("15:04:05.000"))
	if err := e.watch.Err(); err != nil {
		e.t.Fatalf("after %s: %v", what, err)
	}
	return d
}

// stepAt is stepFrom for a step that returns when its event happened
// (zero: when it returned): it returns and logs that time since origin.
func (e *env) stepAt(origin time.Time, what string, f func(ctx context.Context) (time.Time, error)) time.Duration {
	e.t.Helper()
	at, err := f(e.ctx)
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	if at.IsZero() {
		at = time.Now()
	}
	d := at.Sub(origin)
	e.t.Logf("timing %s %-40s %6.2fs (since %s)", e.kind, what+":", d.Seconds(), origin.Format("15:04:05.000"))
	if err := e.watch.Err(); err != nil {
		e.t.Fatalf("after %s: %v", what, err)
	}
	return d
}

// watchDetaches records every detach in the cluster from now on.
func (e *env) watchDetaches() *stack.DetachLog {
	e.t.Helper()
	w, err := stack.LogDetaches(e.ctx, e.c.Client)
	if err != nil {
		e.t.Fatal(err)
	}
	return w
}

// waitDetach waits until detaches has an event of kind for pv on node,
// at or after since, and returns its time.
func (e *env) waitDetach(ctx context.Context, detaches *stack.DetachLog, kind stack.DetachKind, pv, node string, since time.Time, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		if at, ok := detaches.First(kind, pv, node, since); ok {
			return at, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, fmt.Errorf("%s: no %q on %s after %s: %w", pv, kind, node, timeout, ctx.Err())
		case <-ticker.C:
		}
	}
}

// createStatefulSet creates sts and waits until it has rolled out, each
// pod on a node of its volume's zone with its volume attached there alone.
func (e *env) createStatefulSet(ctx context.Context, sts *appsv1.StatefulSet) ([]v1.Pod, error) {
	if _, err := e.c.Client.AppsV1().StatefulSets(sts.Namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	pods, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, sts.Namespace, sts.Name, stepTimeout)
	if err != nil {
		return nil, err
	}
	return pods, e.checkPlacement(ctx, sts.Namespace, sts.Name, pods)
}

// movedAway waits until the StatefulSet name has rolled out again, the
// pod old replaced by one on another node than from, every pod placed as
// checkPlacement wants.
func (e *env) movedAway(ctx context.Context, ns, name string, old v1.Pod, from string) error {
	p, err := stack.WaitPodRecreated(ctx, e.c.Client, ns, old.Name, old.UID, stepTimeout)
	if err != nil {
		return err
	}
	if p.Spec.NodeName == from {
		return fmt.Errorf("pod %s back on %s", p.Name, from)
	}
	pods, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, stepTimeout)
	if err != nil {
		return err
	}
	e.t.Logf("%s moved from %s to %s", old.Name, from, p.Spec.NodeName)
	return e.checkPlacement(ctx, ns, name, pods)
}

// volume returns the PV bound to the claim and its unique name.
func (e *env) volume(ns, claim string) (pv, unique string) {
	e.t.Helper()
	c, err := e.c.Client.CoreV1().PersistentVolumeClaims(ns).Get(e.ctx, claim, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	p, err := e.c.Client.CoreV1().PersistentVolumes().Get(e.ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p.Name, framework.CSIVolumeName(p.Spec.CSI.Driver, p.Spec.CSI.VolumeHandle)
}

// attachedTo checks that pv is attached to node (a VolumeAttachment,
// attached) and listed in its volumesAttached.
func (e *env) attachedTo(ctx context.Context, pv, node string) error {
	vas, err := e.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(vas.Items, func(va storagev1.VolumeAttachment) bool {
		return pvOf(&va) == pv && va.Spec.NodeName == node && va.Status.Attached && va.DeletionTimestamp == nil
	}) {
		return fmt.Errorf("PV %s has no VolumeAttachment attached on %s", pv, node)
	}
	p, err := e.c.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
	if err != nil {
		return err
	}
	unique := v1.UniqueVolumeName(framework.CSIVolumeName(p.Spec.CSI.Driver, p.Spec.CSI.VolumeHandle))
	n, err := e.c.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == unique }) {
		return fmt.Errorf("%s not in volumesAttached of %s", unique, node)
	}
	return nil
}

// checkForced checks the forced detaches, by reason, against want: this
// controller's counter, or kube-controller-manager's log lines. Each is a
// figure.
func (e *env) checkForced(f *figures, want map[string]int) {
	e.t.Helper()
	reasons := []string{"timeout", "out-of-service"}
	got := map[string]int{}
	matches := func() bool {
		return !slices.ContainsFunc(reasons, func(r string) bool { return got[r] != want[r] })
	}
	switch e.kind {
	case stack.Ours:
		// A scrape may be served a gather up to 2 s old.
		var err error
		pollCtx(e.ctx, 500*time.Millisecond, 10*time.Second, func() bool {
			var m framework.Metrics
			if m, err = e.c.Controller.Metrics(e.ctx); err != nil {
				return false
			}
			got = map[string]int{}
			for _, s := range m.Select(metricForced, nil) {
				got[s.Labels["reason"]] += int(s.Value)
			}
			return matches()
		})
		if err != nil {
			e.t.Fatal(err)
		}
	default:
		for _, d := range stack.ForcedDetaches(e.c.ControllerManager.Output()) {
			got[d.Reason]++
		}
	}
	for _, reason := range reasons {
		f.add(e.kind, "forced detaches, "+reason, "%d", got[reason])
		if got[reason] != want[reason] {
			e.t.Errorf("%d forced detaches by %s, want %d", got[reason], reason, want[reason])
		}
	}
}

// logDetaches logs every detach seen since origin, timed from it.
func (e *env) logDetaches(detaches *stack.DetachLog, origin time.Time) {
	var b strings.Builder
	for _, d := range detaches.Events(origin) {
		fmt.Fprintf(&b, "\n  +%7.1fs %s: %s on %s", d.At.Sub(origin).Seconds(), d.Volume, d.Kind, d.Node)
	}
	e.t.Logf("detaches since %s:%s", origin.Format("15:04:05.000"), b.String())
}

// preferNode makes the StatefulSet's pods prefer node (node affinity on
// its name): the scheduler puts them there while it can, elsewhere after.
func preferNode(sts *appsv1.StatefulSet, node string) {
	sts.Spec.Template.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node},
			}}},
		}},
	}}
}
