package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// stepTimeout bounds every step. A pod of a StatefulSet waits for its
	// claim's volume to be provisioned, bound, attached and mounted, and
	// OrderedReady creates them one by one: the margin is for loaded CI
	// machines.
	stepTimeout = 2 * time.Minute
	// logTail is how much of each process's log a failed test shows.
	logTail = 6 * 1024
	// keepLogsEnv, set, keeps the logs of a test that passed too.
	keepLogsEnv = "ADC_KEEP_LOGS"
)

// forEachController runs scenario with this controller, then with
// kube-controller-manager's attachdetach controller, as subtests. In the
// small set (-short) only this controller runs: make test-cluster-full
// runs the control too.
func forEachController(t *testing.T, scenario func(t *testing.T, kind stack.AttachDetach)) {
	for _, kind := range []stack.AttachDetach{stack.Ours, stack.KubeControllerManager} {
		t.Run(string(kind), func(t *testing.T) {
			if kind == stack.KubeControllerManager && testing.Short() {
				t.Skip("the control run is in the full set: make test-cluster-full")
			}
			scenario(t, kind)
		})
	}
}

// fullSet skips the test in the small set (-short, make test-cluster):
// make test-cluster-full runs it.
func fullSet(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("in the full set: make test-cluster-full")
	}
}

// env is one cluster of a test.
type env struct {
	t    *testing.T
	ctx  context.Context
	kind stack.AttachDetach
	c    *stack.Cluster
	// watch judges every attachment from the cluster's start.
	watch *stack.AttachmentWatch
	// otherControllerExpected: the test runs kube-controller-manager's
	// attachdetach beside this controller on purpose; stop does not
	// require the guard to stay quiet.
	otherControllerExpected bool
}

// startCluster starts a cluster with kind attaching, stopped at the end of
// the test; a failed test shows the last lines of each process's log and
// keeps the logs.
func startCluster(t *testing.T, kind stack.AttachDetach, o stack.ClusterOptions) *env {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	o.Options.BinDir = binaries.BinDir
	o.Options.ControllerBinary = binaries.ControllerBinary
	o.Options.KubeletsimBinary = binaries.KubeletsimBinary
	o.Options.Logger = binaries.Logger
	o.AttachDetach = kind
	started := time.Now()
	c, err := stack.StartCluster(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: t.Context(), kind: kind, c: c}
	t.Cleanup(e.stop)
	t.Logf("timing %s cluster started (%d nodes, %d zones): %.2fs", kind, len(c.Nodes), len(c.Zones), time.Since(started).Seconds())
	// Stopped with the test's context, before stop.
	if e.watch, err = stack.WatchAttachments(t.Context(), c.Client); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) stop() {
	if !e.otherControllerExpected {
		e.guardQuiet()
	}
	if e.t.Failed() {
		for _, p := range e.c.Processes() {
			e.t.Logf("--- last lines of %s (%s):\n%s", p.Name, p.LogPath, p.Tail(logTail))
		}
	}
	if e.t.Failed() || os.Getenv(keepLogsEnv) != "" {
		e.keepLogs()
	}
	if err := e.c.Stop(); err != nil {
		e.t.Error(err)
	}
}

// guardQuiet fails the test if this controller's guard reported another
// attach/detach controller: kube-controller-manager runs here with
// --controllers=*,-attachdetach and its other controllers (PV binder,
// StatefulSet, node lifecycle, ephemeral volume, ...) post events and write
// the same objects, none of which is an attach/detach controller's.
func (e *env) guardQuiet() {
	if e.kind != stack.Ours {
		return
	}
	// The test's context is done by now.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reports, err := e.guardReports(ctx)
	if err != nil {
		e.t.Errorf("guard: %v", err)
	}
	for _, r := range reports {
		e.t.Errorf("guard: a false report beside kube-controller-manager --controllers=*,-attachdetach: %s", r)
	}
}

// guardReports lists what this controller's guard reports: the metric, read
// from the running controller, and the Warning events, read from the API
// (a report by an earlier replica, before a restart, counts too).
func (e *env) guardReports(ctx context.Context) ([]string, error) {
	var reports []string
	if c := e.c.Controller; c != nil && running(c.Process) {
		m, err := c.Metrics(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the controller's metrics: %w", err)
		}
		if len(m.Select(otherWriterObjects, map[string]string{"resource": "events"})) == 0 {
			return nil, fmt.Errorf("the controller exports no %s{resource=\"events\"}: is the guard's event watch on?", otherWriterObjects)
		}
		for _, s := range m.Select(otherWriterObjects, nil) {
			if s.Value != 0 {
				reports = append(reports, fmt.Sprintf("%s%v = %v", otherWriterObjects, s.Labels, s.Value))
			}
		}
	}
	events, err := e.c.Client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "reason=" + guardReason})
	if err != nil {
		return reports, fmt.Errorf("list events: %w", err)
	}
	for _, ev := range events.Items {
		reports = append(reports, fmt.Sprintf("event %s on %s %s/%s: %s", ev.Reason, ev.InvolvedObject.Kind, ev.InvolvedObject.Namespace, ev.InvolvedObject.Name, ev.Message))
	}
	return reports, nil
}

// running says whether p has not exited.
func running(p *framework.Process) bool {
	if p == nil {
		return false
	}
	select {
	case <-p.Done():
		return false
	default:
		return true
	}
}

const (
	// otherWriterObjects and guardReason are the guard's metric and
	// Warning event (pkg/guard).
	otherWriterObjects = "attachdetach_controller_other_writer_objects"
	guardReason        = "AnotherAttachDetachController"
)

// keepLogs copies every log where it outlives the cluster's directory.
func (e *env) keepLogs() {
	dir, err := os.MkdirTemp("", "adc-cluster-logs-")
	if err != nil {
		e.t.Log(err)
		return
	}
	for _, p := range e.c.Processes() {
		data, err := os.ReadFile(p.LogPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, filepath.Base(p.LogPath)), data, 0o644)
		}
		if err != nil {
			e.t.Log(err)
		}
	}
	e.t.Logf("logs kept in %s", dir)
}

// namespace creates a namespace named after base.
func (e *env) namespace(base string) string {
	e.t.Helper()
	suffix := make([]byte, 2)
	if _, err := rand.Read(suffix); err != nil {
		e.t.Fatal(err)
	}
	ns := base + "-" + hex.EncodeToString(suffix)
	if _, err := framework.CreateNamespace(e.ctx, e.c.Client, ns); err != nil {
		e.t.Fatal(err)
	}
	return ns
}

// step runs one step of a scenario and logs its time as a "timing" line;
// the attachment watch's verdict is checked after it.
func (e *env) step(what string, f func(ctx context.Context) error) {
	e.t.Helper()
	start := time.Now()
	if err := f(e.ctx); err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
	e.t.Logf("timing %s %-40s %6.2fs", e.kind, what+":", time.Since(start).Seconds())
	if err := e.watch.Err(); err != nil {
		e.t.Fatalf("after %s: %v", what, err)
	}
}

// checkPlacement checks each pod's claim of the StatefulSet name: its PV
// was provisioned in the zone of the pod's node, is attached to that node
// alone (a VolumeAttachment attached, listed in the node's volumesAttached)
// and mounted (the node's volumesInUse).
func (e *env) checkPlacement(ctx context.Context, ns, name string, pods []v1.Pod) error {
	vas, err := e.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i, pod := range pods {
		claim, err := e.c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, stack.StatefulSetClaim(name, i), metav1.GetOptions{})
		if err != nil {
			return err
		}
		pv, err := e.c.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node, err := e.c.Client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		zone := node.Labels[v1.LabelTopologyZone]
		if got := pvZones(pv); !slices.Equal(got, []string{zone}) {
			return fmt.Errorf("PV %s of %s is in zones %v, its pod's node %s in %s", pv.Name, claim.Name, got, node.Name, zone)
		}
		var on []string
		for _, va := range vas.Items {
			if p := va.Spec.Source.PersistentVolumeName; p != nil && *p == pv.Name {
				on = append(on, va.Spec.NodeName)
				if va.Spec.NodeName == node.Name && !va.Status.Attached {
					return fmt.Errorf("VolumeAttachment %s of PV %s on %s not attached", va.Name, pv.Name, node.Name)
				}
			}
		}
		if !slices.Equal(on, []string{node.Name}) {
			return fmt.Errorf("PV %s of pod %s on %s: VolumeAttachments on %v", pv.Name, pod.Name, node.Name, on)
		}
		unique := v1.UniqueVolumeName(framework.CSIVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle))
		if !slices.ContainsFunc(node.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == unique }) {
			return fmt.Errorf("%s not in volumesAttached of %s", unique, node.Name)
		}
		if !slices.Contains(node.Status.VolumesInUse, unique) {
			return fmt.Errorf("%s not in volumesInUse of %s", unique, node.Name)
		}
	}
	return nil
}

// pvZones are the zones the PV's node affinity allows.
func pvZones(pv *v1.PersistentVolume) []string {
	var zones []string
	if pv.Spec.NodeAffinity == nil || pv.Spec.NodeAffinity.Required == nil {
		return nil
	}
	for _, term := range pv.Spec.NodeAffinity.Required.NodeSelectorTerms {
		for _, r := range term.MatchExpressions {
			if r.Key == v1.LabelTopologyZone && r.Operator == v1.NodeSelectorOpIn {
				zones = append(zones, r.Values...)
			}
		}
	}
	return zones
}

// detached waits until no VolumeAttachment of the claims' PVs is left:
// the volumes of pods gone are detached (the claims stay, as a
// StatefulSet's do).
func (e *env) detached(ctx context.Context, ns string, claims ...string) error {
	var pvs []string
	for _, c := range claims {
		claim, err := e.c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, c, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pvs = append(pvs, claim.Spec.VolumeName)
	}
	var left []string
	ok := framework.Poll(e.t, stepTimeout, func() (bool, error) {
		vas, err := e.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		left = nil
		for _, va := range vas.Items {
			if slices.Contains(pvs, pvOf(&va)) {
				left = append(left, pvOf(&va)+" on "+va.Spec.NodeName)
			}
		}
		return len(left) == 0, nil
	})
	if !ok {
		return fmt.Errorf("still attached after %s: %v", stepTimeout, left)
	}
	return nil
}

func pvOf(va *storagev1.VolumeAttachment) string {
	if p := va.Spec.Source.PersistentVolumeName; p != nil {
		return *p
	}
	return ""
}
