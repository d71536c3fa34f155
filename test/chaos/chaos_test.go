package chaos

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// convergeTimeout bounds the time to converge after each fault.
	convergeTimeout = 2 * time.Minute
	awsEBSPlugin    = "kubernetes.io/aws-ebs"
)

// The fault kinds.
const (
	faultKillLeader   = "SIGKILL of the leader"
	faultKillStandby  = "SIGKILL of the standby"
	faultAPIServer    = "kube-apiserver restart"
	faultNotReady     = "node NotReady"
	faultOutOfService = "node out-of-service, its pods deleted at once"
	faultCutOver      = "cut-over to kube-controller-manager and back"
	faultNone         = "churn only"
)

var faultKinds = []string{faultKillLeader, faultKillStandby, faultAPIServer, faultNotReady, faultOutOfService, faultCutOver,
	faultDeleteInUse, faultDeleteWaited, faultDeleteFailing, faultStatusEntry, faultCompacted, faultWatchesCut, faultZoneRestart, faultNone}

// kubeControllerManager returns the kube-controller-manager binary the
// Makefile builds (make tools), or "".
func kubeControllerManager() string {
	dir := os.Getenv(framework.BinDirEnv)
	if dir == "" {
		root, err := framework.ModuleRoot()
		if err != nil {
			return ""
		}
		dir = filepath.Join(root, "_output", "bin")
	}
	p := filepath.Join(dir, "kube-controller-manager")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// TestChaos: churn (ReadWriteOnce claims handed over between nodes,
// ReadWriteMany claims on several nodes, migrated in-tree EBS volumes, pods
// deleted right after their volume attached) under faults (the leader or
// the standby of two replicas killed, kube-apiserver restarted, nodes
// NotReady or out-of-service, a cut-over to kube-controller-manager, third
// parties deleting VolumeAttachments or editing volumesAttached, watches
// that cannot resume and list again, a restart while a zone is cut off with
// nodes deleted before it), with every VolumeAttachment and Node the API
// server records checked against I1-I3 and I10 and, after each fault, the
// cluster converging within convergeTimeout (I4: every pod's volumes
// attached and reported, nothing else attached or reported).
//
// The kinds of fault come in shuffled cycles, the slow ones first (the zone
// fault leads the first cycle), so that a short run sees as many kinds as
// it has rounds and ends soon after its duration.
//
// CHAOS_DURATION (default 90s) is the length of the run; CHAOS_SEED replays
// the schedule of churn and faults (timing still varies); CHAOS_FAULTS
// (e.g. "cut-over,SIGKILL of the leader") limits the faults to the kinds
// starting with those words; CHAOS_CONTROLLER_FLAGS adds flags to the
// replicas (e.g. --disable-zone-disruption-guard: the zone fault must then
// fail the run). The logs and the timeline are kept in
// _output/chaos/<seed> when the run fails, or with CHAOS_KEEP_LOGS=1.
func TestChaos(t *testing.T) {
	duration := 90 * time.Second
	if d := os.Getenv("CHAOS_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("CHAOS_DURATION=%q: %v", d, err)
		}
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("CHAOS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("chaos run of %s, seed %d (CHAOS_SEED=%d replays its schedule)", duration, seed, seed)

	kinds := faultKinds
	if f := os.Getenv("CHAOS_FAULTS"); f != "" {
		// A comma-separated subset of the fault kinds, for chasing one.
		kinds = nil
		for _, k := range strings.Split(f, ",") {
			i := slices.IndexFunc(faultKinds, func(kind string) bool { return strings.HasPrefix(kind, strings.TrimSpace(k)) })
			if i < 0 {
				t.Fatalf("CHAOS_FAULTS: no fault kind starts with %q; kinds: %q", k, faultKinds)
			}
			kinds = append(kinds, faultKinds[i])
		}
	}
	h := newHarness(t, rand.New(rand.NewSource(seed)))
	deadline := time.Now().Add(duration)
	var cycle []string
	for round := 1; time.Now().Before(deadline); round++ {
		h.churn()
		if len(cycle) == 0 {
			cycle = h.cycle(kinds, round == 1)
		}
		next := 0
		if time.Until(deadline) < slowRound {
			// The slow ones are left for later: the run would end a
			// minute late.
			next = max(0, slices.IndexFunc(cycle, func(k string) bool { return !slices.Contains(slowFaults, k) }))
		}
		kind := cycle[next]
		cycle = slices.Delete(cycle, next, next+1)
		start := time.Now()
		mark := h.markRelists()
		h.inject(kind, mark)
		h.converge(kind, round, start)
		h.countRelists(kind, mark)
	}
	h.stopControllers()
	violations, unjudged := h.checker.Judge()
	h.summary(t, violations, unjudged)
	h.checkRelists()
	h.checkZoneHolds()
	if len(violations) > 0 {
		for _, v := range violations {
			t.Error(v)
		}
		t.Logf("logs of every process and the run's timeline kept in %s", h.keepLogs(seed))
		t.Fatalf("%d violations; replay the schedule with CHAOS_SEED=%d", len(violations), seed)
	}
	if os.Getenv("CHAOS_KEEP_LOGS") != "" {
		t.Logf("logs of every process and the run's timeline kept in %s", h.keepLogs(seed))
	}
}

// slowFaults are the kinds whose rounds take longest: kube-controller-manager
// runs for 10 s or more; after a compaction the external-attacher's
// informers list again only after their backoff, up to a minute; a zone
// stays disrupted for the max wait for unmount and more. They are not
// started when less than slowRound of the run is left.
var slowFaults = []string{faultCompacted, faultCutOver, faultZoneRestart}

const slowRound = 45 * time.Second

// cycle returns kinds shuffled, the slow ones first. The first cycle of a
// run starts with the zone fault: its round, the max wait for unmount and
// a restart, fits in a run of a minute (make test-chaos), which then
// defers the other slow ones to its end.
func (h *harness) cycle(kinds []string, first bool) []string {
	var slow, fast []string
	for _, i := range h.rng.Perm(len(kinds)) {
		if slices.Contains(slowFaults, kinds[i]) {
			slow = append(slow, kinds[i])
		} else {
			fast = append(fast, kinds[i])
		}
	}
	if i := slices.Index(slow, faultZoneRestart); first && i > 0 {
		slow = append([]string{faultZoneRestart}, slices.Delete(slow, i, i+1)...)
	}
	return append(slow, fast...)
}

type chaosVolume struct {
	Volume
	claim  string
	driver string
	handle string
	rwx    bool
}

type harness struct {
	t       *testing.T
	ctx     context.Context
	rng     *rand.Rand
	client  kubernetes.Interface
	ns      string
	nodes   []string
	lease   string
	zoneA   *zone
	volumes []chaosVolume
	checker *Checker
	// proxy carries the replicas' traffic to kube-apiserver; kubeconfig
	// goes through it.
	proxy      *apiProxy
	kubeconfig string

	mu          sync.Mutex
	controllers []*stack.Controller
	logs        []string
	podSeq      int
	timeline    []string
	kcmLogs     []string

	rounds        int
	relists       atomic.Int64
	actions       map[string]int
	faults        map[string]int
	convergeTimes map[string][]time.Duration
	relistsCaused map[string]relistCount
	zoneHolds     []zoneHold
}

func newHarness(t *testing.T, rng *rand.Rand) *harness {
	suffix := strconv.Itoa(rng.Intn(1 << 20))
	h := &harness{t: t, ctx: t.Context(), rng: rng, client: st.Cluster.Client, ns: "chaos-" + suffix, lease: "chaos-" + suffix,
		checker: NewChecker(), actions: map[string]int{}, faults: map[string]int{}, convergeTimes: map[string][]time.Duration{},
		relistsCaused: map[string]relistCount{}}
	h.proxy, h.kubeconfig = newAPIProxy(t, st.Cluster.Kubeconfig)
	if _, err := framework.CreateNamespace(h.ctx, h.client, h.ns); err != nil {
		t.Fatal(err)
	}
	h.zoneA = h.newZone("a", zoneANodes)
	zoneB := h.newZone("b", zoneBNodes)
	h.nodes = append(slices.Clone(h.zoneA.nodes), zoneB.nodes...)

	for i := range 6 {
		h.addCSIVolume(fmt.Sprintf("rwo-%d", i), false)
	}
	for i := range 2 {
		h.addCSIVolume(fmt.Sprintf("rwx-%d", i), true)
	}
	for i := range 2 {
		h.addEBSVolume(fmt.Sprintf("ebs-%d", i))
	}
	h.watch()
	h.startController()
	h.startController()
	t.Cleanup(h.stopControllers)
	return h
}

func (h *harness) addCSIVolume(claim string, rwx bool) {
	modes := []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	if rwx {
		modes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
	}
	handle := h.ns + "-" + claim
	pv, _, err := framework.CreateBoundPVC(h.ctx, h.client, h.ns, claim, framework.CSISource(stack.MockDriver, handle), modes...)
	if err != nil {
		h.t.Fatal(err)
	}
	v := chaosVolume{Volume: Volume{PV: pv.Name, SingleNode: !rwx, Names: []string{framework.CSIVolumeName(stack.MockDriver, handle)}},
		claim: claim, driver: stack.MockDriver, handle: handle, rwx: rwx}
	h.volumes = append(h.volumes, v)
	h.checker.AddVolume(v.Volume)
}

// addEBSVolume adds an in-tree AWS EBS volume: the nodes migrate the plugin,
// so it is attached through a VolumeAttachment of the EBS CSI driver.
func (h *harness) addEBSVolume(claim string) {
	id := "vol-" + h.ns + "-" + claim
	src := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: id, FSType: "ext4"}}
	pv, _, err := framework.CreateBoundPVC(h.ctx, h.client, h.ns, claim, src, v1.ReadWriteOnce)
	if err != nil {
		h.t.Fatal(err)
	}
	v := chaosVolume{Volume: Volume{PV: pv.Name, SingleNode: true,
		Names: []string{framework.CSIVolumeName(stack.EBSDriver, id), awsEBSPlugin + "/" + id}},
		claim: claim, driver: stack.EBSDriver, handle: id}
	h.volumes = append(h.volumes, v)
	h.checker.AddVolume(v.Volume)
}

// watch feeds the checker every VolumeAttachment and Node event, resuming
// across kube-apiserver restarts from the last resourceVersion seen.
func (h *harness) watch() { watchInto(h.t, h.client, h.checker, &h.relists) }

// startController starts one replica with leader election, as the
// Deployment runs two.
func (h *harness) startController() {
	flags := append([]string{"--kubeconfig=" + h.kubeconfig, "--leader-elect=true", "--leader-elect-resource-name=" + h.lease,
		"--leader-elect-resource-namespace=default",
		"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms",
		"--max-wait-for-unmount=" + maxWaitForUnmount.String(), "--max-wait-for-unmount-deleted-node=" + maxWaitDeletedNode.String()},
		controllerFlags()...)
	c, err := st.StartController(h.ctx, flags...)
	if c != nil {
		h.note("replica %s started (pid %d)", c.Process.Name, c.Process.Pid())
		h.mu.Lock()
		h.controllers = append(h.controllers, c)
		h.logs = append(h.logs, c.Process.LogPath)
		h.mu.Unlock()
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

// running returns the replicas still running, after starting replacements
// for those that exited (a replica that lost the apiserver past its renew
// deadline exits, and its pod restarts).
func (h *harness) running() []*stack.Controller {
	h.mu.Lock()
	var alive []*stack.Controller
	for _, c := range h.controllers {
		select {
		case <-c.Done():
		default:
			alive = append(alive, c)
		}
	}
	h.mu.Unlock()
	for len(alive) < 2 {
		h.startController()
		h.mu.Lock()
		alive = append(alive, h.controllers[len(h.controllers)-1])
		h.mu.Unlock()
	}
	return alive
}

func (h *harness) stopControllers() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.controllers {
		_ = c.Stop(stack.StopGrace)
	}
}

// leader returns the replica holding the Lease, or nil.
func (h *harness) leader() *stack.Controller {
	lease, err := h.client.CoordinationV1().Leases("default").Get(h.ctx, h.lease, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return nil
	}
	// The standby names the leader too ("Another replica leads").
	became := `"Became leader" identity="` + *lease.Spec.HolderIdentity + `"`
	for _, c := range h.running() {
		if strings.Contains(c.Output(), became) {
			return c
		}
	}
	return nil
}

// pods returns the live pods (not being deleted) by claim.
func (h *harness) pods() map[string][]*v1.Pod {
	list, err := h.client.CoreV1().Pods(h.ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string][]*v1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp == nil {
			out[claimOf(p)] = append(out[claimOf(p)], p)
		}
	}
	return out
}

func claimOf(p *v1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return v.PersistentVolumeClaim.ClaimName
		}
	}
	return ""
}

func (h *harness) createPod(claim, node string) string {
	h.podSeq++
	name := fmt.Sprintf("%s-%d", claim, h.podSeq)
	if _, err := framework.CreatePod(h.ctx, h.client, h.ns, name, node, claim); err != nil {
		h.t.Fatal(err)
	}
	return name
}

func (h *harness) deletePod(name string, grace *int64) {
	err := h.client.CoreV1().Pods(h.ns).Delete(h.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: grace})
	if err != nil && !apierrors.IsNotFound(err) {
		h.t.Fatal(err)
	}
}

// note adds a line to the run's timeline.
func (h *harness) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timeline = append(h.timeline, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// keepLogs copies every process's log and the timeline to
// _output/chaos/<seed> (the cluster's directory goes with the stack).
func (h *harness) keepLogs(seed int64) string {
	root, err := framework.ModuleRoot()
	if err != nil {
		return err.Error()
	}
	dir := filepath.Join(root, "_output", "chaos", strconv.FormatInt(seed, 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err.Error()
	}
	for _, p := range st.Processes() {
		if b, err := os.ReadFile(p.LogPath); err == nil {
			_ = os.WriteFile(filepath.Join(dir, filepath.Base(p.LogPath)), b, 0o644)
		}
	}
	h.mu.Lock()
	_ = os.WriteFile(filepath.Join(dir, "timeline.txt"), []byte(strings.Join(h.timeline, "\n")+"\n"), 0o644)
	h.mu.Unlock()
	for i, out := range h.kcmLogs {
		_ = os.WriteFile(filepath.Join(dir, fmt.Sprintf("kube-controller-manager-%d.log", i+1)), []byte(out), 0o644)
	}
	return dir
}

func (h *harness) node() string { return h.nodes[h.rng.Intn(len(h.nodes))] }

// churn makes a few changes of the kinds a cluster sees.
func (h *harness) churn() {
	h.rounds++
	for range 2 + h.rng.Intn(4) {
		pods := h.pods()
		v := h.volumes[h.rng.Intn(len(h.volumes))]
		have := pods[v.claim]
		switch x := h.rng.Intn(10); {
		case x < 4 && !v.rwx && len(have) > 0:
			// Handover: the pod moves to another node.
			old := have[0]
			next := h.node()
			for next == old.Spec.NodeName {
				next = h.node()
			}
			h.deletePod(old.Name, nil)
			name := h.createPod(v.claim, next)
			h.note("handover of %s: pod %s on %s deleted, pod %s on %s created", v.claim, old.Name, old.Spec.NodeName, name, next)
			h.actions["ReadWriteOnce handover"]++
		case x < 7 && (v.rwx || len(have) == 0):
			n := h.node()
			name := h.createPod(v.claim, n)
			h.note("pod %s of %s created on %s", name, v.claim, n)
			h.actions["pod created"]++
		case x < 8 && len(have) == 0:
			// Deleted at once after its volume attached.
			n := h.node()
			name := h.createPod(v.claim, n)
			h.waitAttached(v, name)
			h.deletePod(name, nil)
			h.note("pod %s of %s on %s deleted right after attach", name, v.claim, n)
			h.actions["pod deleted right after attach"]++
		case len(have) > 0:
			p := have[h.rng.Intn(len(have))]
			h.deletePod(p.Name, nil)
			h.note("pod %s of %s on %s deleted", p.Name, v.claim, p.Spec.NodeName)
			h.actions["pod deleted"]++
		}
	}
}

// waitAttached waits a little for the pod's volume to be attached (it may
// not be, if a fault is in the way: the pod is deleted all the same).
func (h *harness) waitAttached(v chaosVolume, pod string) {
	p, err := h.client.CoreV1().Pods(h.ns).Get(h.ctx, pod, metav1.GetOptions{})
	if err != nil {
		return
	}
	name := framework.VolumeAttachmentName(v.handle, v.driver, p.Spec.NodeName)
	framework.Poll(h.t, 20*time.Second, func() (bool, error) {
		va, err := h.client.StorageV1().VolumeAttachments().Get(h.ctx, name, metav1.GetOptions{})
		return err == nil && va.Status.Attached, nil
	})
}

// inject starts a fault of the given kind and ends it (a NotReady node
// comes back, the taint is removed, the informers forced to list again
// have) before returning; m is what had been listed before.
func (h *harness) inject(kind string, m relistMark) {
	h.faults[kind]++
	h.note("fault: %s", kind)
	defer h.note("fault over: %s", kind)
	switch kind {
	case faultKillLeader, faultKillStandby:
		victim := h.leader()
		if kind == faultKillStandby || victim == nil {
			for _, c := range h.running() {
				if c != victim {
					victim = c
					break
				}
			}
		}
		if victim != nil {
			h.note("SIGKILL of replica %s", victim.Process.Name)
			_ = victim.Process.Kill()
		}
		h.running()
	case faultAPIServer:
		if err := st.Cluster.RestartAPIServer(h.ctx, time.Duration(1+h.rng.Intn(4))*time.Second); err != nil {
			h.t.Fatal(err)
		}
		h.running()
	case faultNotReady:
		n := h.node()
		h.setReady(n, false)
		// Less than maxWaitForUnmount.
		h.sleep(time.Duration(5+h.rng.Intn(10)) * time.Second)
		h.setReady(n, true)
	case faultOutOfService:
		n := h.node()
		h.setReady(n, false)
		h.taint(n, true)
		zero := int64(0)
		for _, ps := range h.pods() {
			for _, p := range ps {
				if p.Spec.NodeName == n {
					h.deletePod(p.Name, &zero)
				}
			}
		}
		h.sleep(time.Duration(5+h.rng.Intn(5)) * time.Second)
		h.taint(n, false)
		h.setReady(n, true)
	case faultCutOver:
		h.cutOver()
	case faultDeleteInUse:
		h.deleteInUse()
	case faultDeleteWaited, faultDeleteFailing:
		h.multiAttach(kind == faultDeleteFailing)
	case faultStatusEntry:
		h.statusEntry()
	case faultCompacted:
		rev, err := st.Cluster.RestartAPIServerCompacted(h.ctx, time.Duration(1+h.rng.Intn(2))*time.Second)
		if err != nil {
			h.t.Fatal(err)
		}
		h.note("etcd compacted at revision %d while kube-apiserver was down", rev)
		// Before the watches are back, or while they list again.
		h.forget()
		h.running()
		h.awaitRelists(m)
	case faultZoneRestart:
		h.zoneRestart()
	case faultWatchesCut:
		h.proxy.cut()
		rev, err := st.Cluster.CompactEtcd(h.ctx)
		if err != nil {
			h.proxy.resume()
			h.t.Fatal(err)
		}
		h.note("replicas cut off from kube-apiserver, etcd compacted at revision %d", rev)
		h.forget()
		// Shorter than the renew deadline: the leader stays.
		h.sleep(time.Duration(500+h.rng.Intn(1000)) * time.Millisecond)
		h.proxy.resume()
		h.note("replicas reach kube-apiserver again")
		h.awaitRelists(m)
	case faultNone:
	}
}

// cutOver stops this controller's replicas (SIGTERM: they release the
// Lease), runs kube-controller-manager's attachdetach controller through
// some churn, then stops it and starts the replicas again, as
// docs/operations.md switches and rolls back.
func (h *harness) cutOver() {
	kcm := kubeControllerManager()
	if kcm == "" {
		h.t.Log("no kube-controller-manager in the tools directory (make tools builds it): cut-over skipped")
		return
	}
	h.mu.Lock()
	for _, c := range h.controllers {
		_ = c.Process.Terminate(30 * time.Second)
	}
	h.controllers = nil
	h.mu.Unlock()
	p := framework.StartProcess(h.t, kcm, framework.KubeControllerManagerArgs(st.Cluster.Kubeconfig, h.t.TempDir())...)
	h.sleep(3 * time.Second)
	h.churn()
	h.sleep(time.Duration(5+h.rng.Intn(5)) * time.Second)
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		p.Kill()
	}
	h.mu.Lock()
	h.kcmLogs = append(h.kcmLogs, p.Output())
	h.mu.Unlock()
	h.running()
}

func (h *harness) sleep(d time.Duration) {
	select {
	case <-h.ctx.Done():
	case <-time.After(d):
	}
}

func (h *harness) setReady(node string, ready bool) {
	framework.Eventually(h.t, 30*time.Second, func() (bool, error) {
		return framework.SetNodeReady(h.ctx, h.client, node, ready) == nil, nil
	}, "node %s Ready=%v", node, ready)
}

func (h *harness) taint(node string, on bool) {
	framework.Eventually(h.t, 30*time.Second, func() (bool, error) {
		n, err := h.client.CoreV1().Nodes().Get(h.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == outOfService })
		if on {
			n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: outOfService, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute})
		}
		_, err = h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{})
		return err == nil, nil
	}, "node %s out-of-service=%v", node, on)
}

// converge waits until I4 holds and records how long it took since the
// fault started.
func (h *harness) converge(kind string, round int, start time.Time) {
	var why, noted string
	ok := framework.Poll(h.t, convergeTimeout, func() (bool, error) {
		h.running()
		var err error
		why, err = h.converged()
		if why != noted && why != "" {
			h.note("not converged: %s", why)
			noted = why
		}
		return err == nil && why == "", nil
	})
	if !ok {
		h.t.Fatalf("round %d, after %s: not converged within %s: %s", round, kind, convergeTimeout, why)
	}
	took := time.Since(start)
	h.convergeTimes[kind] = append(h.convergeTimes[kind], took)
	h.note("converged %s after the fault started", took.Round(100*time.Millisecond))
}

// converged checks I4: every live pod's volume attached to its node and
// listed in its node's status, no VolumeAttachment of these volumes that no
// live pod wants, no node status listing one of them where no live pod
// wants it, no pod still being deleted. It returns why not, or "".
func (h *harness) converged() (string, error) {
	all, err := h.client.CoreV1().Pods(h.ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	vas, err := h.client.StorageV1().VolumeAttachments().List(h.ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	nodeList, err := h.client.CoreV1().Nodes().List(h.ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	reported := map[string]bool{}
	for _, n := range nodeList.Items {
		for _, a := range n.Status.VolumesAttached {
			reported[n.Name+"/"+string(a.Name)] = true
		}
	}
	byVA := map[string]*storagev1.VolumeAttachment{}
	for i := range vas.Items {
		byVA[vas.Items[i].Name] = &vas.Items[i]
	}
	wanted := map[string]bool{}
	for _, p := range all.Items {
		if p.DeletionTimestamp != nil {
			return fmt.Sprintf("pod %s still being deleted", p.Name), nil
		}
		for _, v := range h.volumes {
			if v.claim != claimOf(&p) {
				continue
			}
			name := framework.VolumeAttachmentName(v.handle, v.driver, p.Spec.NodeName)
			wanted[name] = true
			va := byVA[name]
			if va == nil || !va.Status.Attached || va.DeletionTimestamp != nil {
				return fmt.Sprintf("%s of pod %s not attached to %s", v.PV, p.Name, p.Spec.NodeName), nil
			}
			if !slices.ContainsFunc(v.Names, func(n string) bool { return reported[p.Spec.NodeName+"/"+n] }) {
				return fmt.Sprintf("%s of pod %s not in %s's volumesAttached", v.PV, p.Name, p.Spec.NodeName), nil
			}
		}
	}
	for _, va := range byVA {
		if pv := pvOf(va); slices.ContainsFunc(h.volumes, func(v chaosVolume) bool { return v.PV == pv }) && !wanted[va.Name] {
			return fmt.Sprintf("VolumeAttachment %s of %s on %s wanted by no pod", va.Name, pv, va.Spec.NodeName), nil
		}
	}
	for _, n := range nodeList.Items {
		for _, a := range n.Status.VolumesAttached {
			i := slices.IndexFunc(h.volumes, func(v chaosVolume) bool { return slices.Contains(v.Names, string(a.Name)) })
			if i >= 0 && !wanted[framework.VolumeAttachmentName(h.volumes[i].handle, h.volumes[i].driver, n.Name)] {
				return fmt.Sprintf("%s's volumesAttached lists %s, attached there for no pod", n.Name, a.Name), nil
			}
		}
	}
	return "", nil
}

func (h *harness) summary(t *testing.T, violations []string, unjudged int) {
	var b strings.Builder
	fmt.Fprintf(&b, "chaos summary: %d rounds, %d VolumeAttachment and Node events checked (%d watches listed again, %d detaches unjudged in what they missed), %d violations\n",
		h.rounds, h.checker.Events(), h.relists.Load(), unjudged, len(violations))
	keys := func(m map[string]int) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		sort.Strings(ks)
		return ks
	}
	for _, k := range keys(h.actions) {
		fmt.Fprintf(&b, "  churn  %-70s %d\n", k, h.actions[k])
	}
	for _, k := range keys(h.faults) {
		d := slices.Clone(h.convergeTimes[k])
		slices.Sort(d)
		var median, worst time.Duration
		if len(d) > 0 {
			median, worst = d[len(d)/2], d[len(d)-1]
		}
		fmt.Fprintf(&b, "  fault  %-70s %d  converged: median %s, max %s", k, h.faults[k],
			median.Round(100*time.Millisecond), worst.Round(100*time.Millisecond))
		if k == faultZoneRestart {
			b.WriteString(h.zoneSummary())
		}
		if r := h.relistsCaused[k]; r.controller > 0 || r.checker > 0 || k == faultCompacted || k == faultWatchesCut {
			fmt.Fprintf(&b, "; lists again: leader's informers %d, checker's watches %d", r.controller, r.checker)
			if r.leaderChanged > 0 {
				fmt.Fprintf(&b, " (leader changed %d times)", r.leaderChanged)
			}
		}
		b.WriteString("\n")
	}
	t.Log(b.String())
}

// TestCheckerSeesAViolationOnTheAPIServer: the checker, fed by the same
// watches as TestChaos, reports a ReadWriteOnce volume whose
// VolumeAttachments were created on two nodes by hand: the run can fail.
func TestCheckerSeesAViolationOnTheAPIServer(t *testing.T) {
	ctx := t.Context()
	client := st.Cluster.Client
	ns := "chaos-planted"
	if _, err := framework.CreateNamespace(ctx, client, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pv, _, err := framework.CreateBoundPVC(ctx, client, ns, "data", framework.CSISource("planted.csi.example.com", "h"), v1.ReadWriteOnce)
	if err != nil {
		t.Fatal(err)
	}
	checker := NewChecker(Volume{PV: pv.Name, SingleNode: true, Names: []string{framework.CSIVolumeName("planted.csi.example.com", "h")}})
	var relists atomic.Int64
	watchInto(t, client, checker, &relists)
	for _, node := range []string{"planted-a", "planted-b"} {
		va := &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: framework.VolumeAttachmentName("h", "planted.csi.example.com", node)},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: "planted.csi.example.com", NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
		}
		if _, err := client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_ = client.StorageV1().VolumeAttachments().Delete(context.Background(), va.Name, metav1.DeleteOptions{})
		}()
	}
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		v := checker.Violations()
		return len(v) == 1 && strings.HasPrefix(v[0], "I1: single-node volume "+pv.Name), nil
	}, "the checker to report the planted I1 violation")
}
