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

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestZonePartition (the full set): every kubelet of one zone stops at
// once, as a zone cut off from the control plane looks; its pods may well
// still run and write. Six nodes in two zones, a StatefulSet with one pod
// on each node of zone-a, another in zone-b.
//
// kube-controller-manager's node lifecycle sees zone-a go FullDisruption
// (no node Ready; zone-b Normal): as long as one zone is not fully
// disrupted it keeps tainting and evicting at the normal rate, so the three
// pods are evicted and stay Terminating (no kubelet finishes them). The
// operator force-deletes one of them. Its volume is then unwanted and, as
// far as the node's last status says, still mounted on a node not Ready:
// kube-controller-manager's attachdetach controller force-detaches it once
// its 6 minutes of max wait for unmount have passed, under a pod that may
// still be writing. This controller finds zone-a disrupted (its 3 nodes of
// 3 not Ready: --unhealthy-zone-threshold 55 %, --unhealthy-zone-min-nodes
// 3) and holds that detach: for 6 minutes 45 s after the force delete no
// VolumeAttachment of a zone-a node is deleted and no volume leaves their
// volumesAttached, the held detach is counted (forced_detaches_held 1) and
// /explain names the zone that holds it. zone-b's pods run untouched.
//
// Then zone-a's kubelets come back: every pod of both StatefulSets Running
// again with its volume attached on its node alone, and with this
// controller, nothing force-detached at any time (the volumes that moved
// were detached after their kubelet unmounted them).
func TestZonePartition(t *testing.T) {
	fullSet(t)
	sideBySide(t, zonePartition)
}

func zonePartition(t *testing.T, kind stack.AttachDetach, f *figures) {
	e := startCluster(t, kind, stack.ClusterOptions{Nodes: 6, Zones: 2})
	detaches := e.watchDetaches()
	zone, other := e.c.Zones[0], e.c.Zones[1]
	cut := e.c.NodesIn(zone)
	var cutNames []string
	for _, n := range cut {
		cutNames = append(cutNames, n.Name)
	}
	ns := e.namespace("partition")
	const part, rest = "part", "rest"
	pods := map[string][]v1.Pod{}
	e.step("create part (3, in "+zone+") and rest (2, in "+other+")", func(ctx context.Context) error {
		for _, s := range []struct {
			name     string
			replicas int32
			zone     string
		}{{part, int32(len(cut)), zone}, {rest, 2, other}} {
			sts := stack.StatefulSet(ns, s.name, s.replicas, e.c.StorageClass)
			sts.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
			onePerNodeIn(sts, s.zone)
			got, err := e.createStatefulSet(ctx, sts)
			if err != nil {
				return err
			}
			pods[s.name] = got
		}
		return nil
	})
	pvs := make([]string, len(pods[part]))
	for i := range pods[part] {
		pvs[i], _ = e.volume(ns, stack.StatefulSetClaim(part, i))
	}
	victim := pods[part][0]
	_, victimName := e.volume(ns, stack.StatefulSetClaim(part, 0))
	if kind == stack.Ours {
		e.expectMetrics(map[string]float64{metricDisruptedZones: 0})
	}

	cutAt := time.Now()
	e.eachNode(cut, (*stack.HollowNode).StopKubelet)
	f.dur(kind, "zone cut: its 3 nodes NotReady", e.stepFrom(cutAt, zone+"'s kubelets stopped: nodes NotReady", func(ctx context.Context) error {
		for _, n := range cutNames {
			if err := stack.WaitNodeNotReady(ctx, e.c.Client, n, stepTimeout); err != nil {
				return err
			}
		}
		return nil
	}))
	f.dur(kind, "zone cut: node lifecycle says FullDisruption", e.stepAt(cutAt, "kube-controller-manager: "+zone+" FullDisruption", func(ctx context.Context) (time.Time, error) {
		return e.zoneState(ctx, zone, "FullDisruption", cutAt)
	}))
	if kind == stack.Ours {
		f.dur(kind, "zone cut: this controller says disrupted (metric)", e.stepFrom(cutAt, "this controller: "+zone+" disrupted", func(ctx context.Context) error {
			return e.waitMetric(ctx, metricDisruptedZones, 1)
		}))
	}
	f.dur(kind, "zone cut: its 3 pods evicted (Terminating)", e.stepFrom(cutAt, zone+"'s pods evicted, Terminating", func(ctx context.Context) error {
		for _, p := range pods[part] {
			if _, err := stack.WaitPodTerminating(ctx, e.c.Client, ns, p.Name, p.UID, 3*time.Minute); err != nil {
				return err
			}
		}
		return nil
	}))
	tainted := 0
	for _, n := range cutNames {
		ok, err := stack.NodeTainted(e.ctx, e.c.Client, n, v1.TaintNodeUnreachable, v1.TaintEffectNoExecute)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			tainted++
		}
	}
	f.add(kind, "zone cut: nodes tainted unreachable:NoExecute", "%d of %d", tainted, len(cutNames))

	// The operator, seeing part-0 stuck, force-deletes it.
	forcedAt := time.Now()
	if err := stack.ForceDeletePod(e.ctx, e.c.Client, ns, victim.Name, victim.UID); err != nil {
		t.Fatal(err)
	}
	holdUntil := forcedAt.Add(upstreamMaxWait + holdMargin)
	var firstDetach *stack.DetachEvent
	e.stepFrom(forcedAt, fmt.Sprintf("force delete of %s, then %s", victim.Name, upstreamMaxWait+holdMargin), func(ctx context.Context) error {
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		for time.Now().Before(holdUntil) {
			if got := detaches.Events(cutAt, cutNames...); len(got) > 0 && firstDetach == nil {
				firstDetach = &got[0]
				if kind == stack.Ours {
					return fmt.Errorf("detached in the disrupted zone %s: %v", zone, got)
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-ticker.C:
			}
		}
		return nil
	})
	if firstDetach != nil {
		f.dur(kind, "force delete -> first detach in the cut zone", firstDetach.At.Sub(forcedAt))
		t.Logf("first detach in %s: %s, %.1fs after the force delete", zone, firstDetach, firstDetach.At.Sub(forcedAt).Seconds())
	} else {
		f.add(kind, "force delete -> first detach in the cut zone", "none in %s", upstreamMaxWait+holdMargin)
	}
	e.step("Terminating pods keep their volumes; "+other+" untouched", func(ctx context.Context) error {
		for i, p := range pods[part][1:] {
			if _, err := stack.WaitPodTerminating(ctx, e.c.Client, ns, p.Name, p.UID, time.Second); err != nil {
				return err
			}
			if err := e.attachedTo(ctx, pvs[i+1], p.Spec.NodeName); err != nil {
				return err
			}
		}
		got, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, rest, time.Second)
		if err != nil {
			return err
		}
		for i, p := range got {
			if p.UID != pods[rest][i].UID {
				return fmt.Errorf("pod %s of %s replaced", p.Name, other)
			}
		}
		if d := detaches.Events(cutAt); len(d) > 0 && kind == stack.Ours {
			return fmt.Errorf("detaches during the partition: %v", d)
		}
		return e.checkPlacement(ctx, ns, rest, got)
	})
	switch kind {
	case stack.Ours:
		e.expectMetrics(map[string]float64{metricDisruptedZones: 1, metricHeld: 1, metricForced: 0})
		f.add(kind, "zone cut: forced detaches held (metric)", "1")
		x, _, err := e.c.Controller.ExplainVolume(e.ctx, victimName, victim.Spec.NodeName)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("explain %s on %s: %s: %s", x.Volume, x.Node, x.Action, x.Reason)
		if !strings.Contains(x.Reason, "forced detach held") || !strings.Contains(x.Reason, fmt.Sprintf("zone %q is disrupted", zone)) {
			t.Errorf("/explain of %s on %s: %q, want the forced detach held by zone %s", victimName, victim.Spec.NodeName, x.Reason, zone)
		}
	default:
		for _, d := range stack.ForcedDetaches(e.c.ControllerManager.Output()) {
			t.Logf("kube-controller-manager forced a detach (%s) of %s from %s, %.1fs after the force delete", d.Reason, d.Volume, d.Node, d.At.Sub(forcedAt).Seconds())
		}
	}

	backAt := time.Now()
	e.eachNode(cut, func(n *stack.HollowNode) error { return n.StartKubelet(e.ctx) })
	f.dur(kind, "zone back: kubelets restarted, nodes Ready", e.stepFrom(backAt, zone+"'s kubelets back, nodes Ready", func(ctx context.Context) error {
		for _, n := range cutNames {
			if err := stack.WaitNodeReady(ctx, e.c.Client, n, stepTimeout); err != nil {
				return err
			}
		}
		return nil
	}))
	f.dur(kind, "zone back: every pod Running with its volume", e.stepFrom(backAt, "every pod Running again with its volume", func(ctx context.Context) error {
		for _, name := range []string{part, rest} {
			if err := e.converged(ctx, ns, name, 4*time.Minute); err != nil {
				return err
			}
		}
		return nil
	}))
	f.dur(kind, "zone back: node lifecycle says Normal", e.stepAt(backAt, "kube-controller-manager: "+zone+" Normal", func(ctx context.Context) (time.Time, error) {
		return e.zoneState(ctx, zone, "Normal", backAt)
	}))
	if kind == stack.Ours {
		e.expectMetrics(map[string]float64{metricDisruptedZones: 0, metricHeld: 0})
		for _, d := range detaches.Events(cutAt, cutNames...) {
			if d.At.Before(backAt) {
				t.Errorf("detached while %s was cut off: %s", zone, d)
			}
		}
	}
	e.checkForced(f, forcedWant(kind))
	var states []string
	for _, s := range stack.ZoneStates(e.c.ControllerManager.Output()) {
		if s.Zone == zone || s.Zone == "(all zones)" {
			states = append(states, fmt.Sprintf("%+.1fs %s", s.At.Sub(cutAt).Seconds(), s.State))
		}
	}
	t.Logf("kube-controller-manager's states of %s, from the cut: %s", zone, strings.Join(states, ", "))
	e.logDetaches(detaches, cutAt)
}

// converged waits until the StatefulSet has rolled out with every pod
// placed as checkPlacement wants. A restarted kubelet may run a pod on a
// volume it reconstructed (marked attached from its own disk) before its
// next status update lists it in volumesInUse: the placement is polled,
// not read once.
func (e *env) converged(ctx context.Context, ns, name string, timeout time.Duration) error {
	var last error
	ok := pollCtx(ctx, time.Second, timeout, func() bool {
		var pods []v1.Pod
		if pods, last = stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, time.Second); last == nil {
			last = e.checkPlacement(ctx, ns, name, pods)
		}
		return last == nil
	})
	if !ok {
		return fmt.Errorf("StatefulSet %s/%s not converged after %s: %w", ns, name, timeout, last)
	}
	return nil
}

// forcedWant are the forced detaches each controller makes in the
// partition: none for this controller; kube-controller-manager's one, the
// force-deleted pod's volume once its max wait passed.
func forcedWant(kind stack.AttachDetach) map[string]int {
	if kind == stack.Ours {
		return map[string]int{}
	}
	return map[string]int{"timeout": 1}
}

// onePerNodeIn confines the StatefulSet's pods to zone, one per node.
func onePerNodeIn(sts *appsv1.StatefulSet, zone string) {
	sts.Spec.Template.Spec.Affinity = &v1.Affinity{
		NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{
				Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{zone},
			}}}},
		}},
		PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: sts.Spec.Selector,
			TopologyKey:   v1.LabelHostname,
		}}},
	}
}

// eachNode runs f on every node side by side.
func (e *env) eachNode(nodes []*stack.HollowNode, f func(*stack.HollowNode) error) {
	e.t.Helper()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = f(n) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

// zoneState waits until kube-controller-manager's log says zone entered
// state after since, and returns when.
func (e *env) zoneState(ctx context.Context, zone, state string, since time.Time) (time.Time, error) {
	var at time.Time
	// The whole log, read once a second: a zone state is logged once.
	ok := pollCtx(ctx, time.Second, stepTimeout, func() bool {
		states := stack.ZoneStates(e.c.ControllerManager.Output())
		i := slices.IndexFunc(states, func(s stack.ZoneState) bool {
			return s.Zone == zone && s.State == state && !s.At.Before(since)
		})
		if i >= 0 {
			at = states[i].At
		}
		return i >= 0
	})
	if !ok {
		return at, fmt.Errorf("kube-controller-manager did not log %s entering %s after %s; its states: %v",
			zone, state, since.Format("15:04:05"), stack.ZoneStates(e.c.ControllerManager.Output()))
	}
	return at, nil
}

// waitMetric waits until this controller's metric name sums to want.
func (e *env) waitMetric(ctx context.Context, name string, want float64) error {
	var got float64
	var err error
	ok := pollCtx(ctx, 200*time.Millisecond, stepTimeout, func() bool {
		var m framework.Metrics
		m, err = e.c.Controller.Metrics(ctx)
		got = m.Sum(name, nil)
		return err == nil && got == want
	})
	if !ok {
		return fmt.Errorf("metric %s: %v, want %v (last error: %v)", name, got, want, err)
	}
	return nil
}

// expectMetrics waits until this controller's metrics, each summed over
// its labels, are want: the controller serves a gather at most 2 s old
// (pkg/metrics CachedGatherer), so a change shows a scrape or two later.
func (e *env) expectMetrics(want map[string]float64) {
	e.t.Helper()
	var wrong []string
	ok := pollCtx(e.ctx, 500*time.Millisecond, 10*time.Second, func() bool {
		m, err := e.c.Controller.Metrics(e.ctx)
		if err != nil {
			wrong = []string{err.Error()}
			return false
		}
		wrong = nil
		for name, v := range want {
			if got := m.Sum(name, nil); got != v {
				wrong = append(wrong, fmt.Sprintf("%s %v, want %v", name, got, v))
			}
		}
		return len(wrong) == 0
	})
	if !ok {
		slices.Sort(wrong)
		e.t.Errorf("metrics after 10s: %s", strings.Join(wrong, "; "))
	}
}

// pollCtx calls cond every interval until it is true (true) or timeout or
// ctx ends (false).
func pollCtx(ctx context.Context, interval, timeout time.Duration, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-ticker.C:
		}
	}
}
