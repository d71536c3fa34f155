package chaos

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The world's nodes are in two zones (topology.kubernetes.io/zone), each
// with the kubelets of one kubeletsim: zone a, which the zone fault cuts
// off, and zone b. The churn and the other faults use the nodes of both.
const (
	zoneANodes = 5
	zoneBNodes = 4
)

// The replicas' max waits for unmount (--max-wait-for-unmount and
// --max-wait-for-unmount-deleted-node): short, so that the zone fault
// outlasts them and the forced detaches by timeout it makes due must be
// held; longer than the NotReady of a node NotReady fault (14 s at most),
// so that no other fault makes one due (I2).
const (
	maxWaitForUnmount  = 16 * time.Second
	maxWaitDeletedNode = 8 * time.Second
)

// faultZoneRestart is the zone fault (zoneRestart).
const faultZoneRestart = "zone disrupted: a restart with nodes deleted before it"

// metricHeld is the controller's gauge of the forced detaches by timeout
// due and held because their zone is disrupted.
const metricHeld = "attachdetach_controller_forced_detaches_held"

// controllerFlags are CHAOS_CONTROLLER_FLAGS, added to every replica's
// flags: e.g. --disable-zone-disruption-guard, for the zone fault to see
// I10 broken.
func controllerFlags() []string { return strings.Fields(os.Getenv("CHAOS_CONTROLLER_FLAGS")) }

// zone is a zone of the world's nodes and their kubelets.
type zone struct {
	name     string // the label's value
	opts     stack.KubeletOptions
	nodes    []string
	kubelets *stack.Process
}

// kubeletStatusPeriod is how often the simulated kubelets write
// volumesInUse: kubelet's 10 s, shortened for a run of many rounds.
const kubeletStatusPeriod = 2 * time.Second

// zoneHold is what one zone fault made the leader do: the forced detaches
// due when it ended, and those it held.
type zoneHold struct {
	due, held int
}

func (h *harness) newZone(name string, nodes int) *zone {
	label := h.ns + "-" + name
	z := &zone{name: label, opts: stack.KubeletOptions{NodePrefix: label + "-", Nodes: nodes,
		MigratedPlugins: []string{awsEBSPlugin}, NodeLabels: map[string]string{v1.LabelTopologyZone: label},
		// kubelet's order of events, in a fifth of its time.
		ExtraArgs: []string{"--node-status-update-frequency=" + kubeletStatusPeriod.String()}}}
	z.nodes = z.opts.NodeNames()
	h.startKubelets(z)
	return z
}

// startKubelets starts the zone's kubelets; they register its nodes (again)
// and report what is mounted there.
func (h *harness) startKubelets(z *zone) {
	p, err := st.StartKubelets(h.ctx, z.opts)
	if p != nil {
		h.t.Cleanup(func() { _ = p.Stop(stack.StopGrace) })
		z.kubelets = p
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

// zoneRestart: zone a is cut off while both replicas are down (the leader
// may well have been in it). Its kubelets stop reporting (their
// volumesInUse stay as last written, a volume mounted on each node), three
// or four of its five nodes turn NotReady, the Node objects of the others
// are deleted, and every pod there is deleted at once, as an operator may
// when a zone stops answering. The replicas that start never read the
// deleted nodes: their zone is lost, and their deletions count in every
// zone. Every volume mounted in zone a is due for a forced detach by
// timeout once the max wait has passed since the start (the deleted nodes'
// sooner), and the zone is disrupted (3 or more of its nodes, 55% or more,
// not ready, the deletions counted or not): none may start (I10). The
// fault lasts until the leader holds them all, proof that they were due;
// then the zone comes back: its nodes Ready, its kubelets registering the
// deleted nodes again and reporting the volumes unmounted, which lets them
// be detached.
func (h *harness) zoneRestart() {
	h.t.Helper()
	z := h.zoneA
	h.mountOnEach(z.nodes)
	var notReady, deleted []string
	gone := 1 + h.rng.Intn(2)
	for i, j := range h.rng.Perm(len(z.nodes)) {
		if i < gone {
			deleted = append(deleted, z.nodes[j])
		} else {
			notReady = append(notReady, z.nodes[j])
		}
	}

	if err := z.kubelets.Kill(); err != nil {
		h.t.Fatal(err)
	}
	h.mu.Lock()
	stopped := h.controllers
	h.controllers = nil
	h.mu.Unlock()
	for _, c := range stopped {
		if err := c.Process.Kill(); err != nil {
			h.t.Fatal(err)
		}
	}
	h.note("zone %s cut off: its kubelets and both replicas killed", z.name)
	from := h.resourceVersion()
	for _, n := range notReady {
		h.setReady(n, false)
	}
	// Those stuck terminating too: no kubelet there finishes them.
	all, err := h.client.CoreV1().Pods(h.ns).List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatalf("list pods: %v", err)
	}
	zero := int64(0)
	for _, p := range all.Items {
		if slices.Contains(z.nodes, p.Spec.NodeName) {
			h.deletePod(p.Name, &zero)
		}
	}
	due := h.mountedIn(z.nodes)
	for _, n := range deleted {
		if err := h.client.CoreV1().Nodes().Delete(h.ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			h.t.Fatalf("delete node %s: %v", n, err)
		}
	}
	// Their CSINodes stay: no garbage collector runs here, and the
	// kubelets update them when they register again.
	h.note("zone %s disrupted: nodes %s NotReady, nodes %s deleted, their pods deleted at once, %d volumes mounted there",
		z.name, strings.Join(notReady, ", "), strings.Join(deleted, ", "), due)

	h.running()
	held := h.awaitHeld(due)
	h.zoneHolds = append(h.zoneHolds, zoneHold{due: due, held: held})
	h.checker.Disrupted(z.name, z.nodes, from, h.resourceVersion())

	for _, n := range notReady {
		h.setReady(n, true)
	}
	h.startKubelets(z)
	h.note("zone %s back: its nodes Ready, the deleted ones registered again", z.name)
}

// mountOnEach makes sure a volume is mounted on each of the nodes: a pod of
// a ReadWriteMany claim is started where none is.
func (h *harness) mountOnEach(nodes []string) {
	h.t.Helper()
	pods := h.pods()
	type start struct {
		v    chaosVolume
		node string
	}
	var rwx []chaosVolume
	for _, v := range h.volumes {
		if v.rwx {
			rwx = append(rwx, v)
		}
	}
	var started []start
	for _, n := range nodes {
		if slices.ContainsFunc(h.volumes, func(v chaosVolume) bool {
			return slices.ContainsFunc(pods[v.claim], func(p *v1.Pod) bool { return p.Spec.NodeName == n }) && h.mounted(v, n) != nil
		}) {
			continue
		}
		v := rwx[h.rng.Intn(len(rwx))]
		pod := h.createPod(v.claim, n)
		h.note("pod %s of %s created on %s, for a volume mounted there", pod, v.claim, n)
		started = append(started, start{v, n})
	}
	for _, s := range started {
		if h.waitMounted(s.v, s.node) == nil {
			h.note("%s not mounted on %s yet", s.v.claim, s.node)
		}
	}
}

// mountedIn counts the VolumeAttachments of the harness's volumes, attached,
// whose volume is in their node's volumesInUse, on the nodes.
func (h *harness) mountedIn(nodes []string) int {
	h.t.Helper()
	n := 0
	for _, node := range nodes {
		for _, v := range h.volumes {
			if h.mounted(v, node) != nil {
				n++
			}
		}
	}
	return n
}

// awaitHeld waits until the leader holds due forced detaches by timeout
// (its gauge), long enough for the max waits to pass after its start, and
// returns how many it held last.
func (h *harness) awaitHeld(due int) int {
	h.t.Helper()
	held := 0
	var scraped time.Time
	ok := framework.Poll(h.t, maxWaitForUnmount+45*time.Second, func() (bool, error) {
		if time.Since(scraped) < time.Second {
			// Each scrape is authorized by kube-apiserver: once a second.
			return false, nil
		}
		scraped = time.Now()
		c := h.leader()
		if c == nil {
			return false, nil
		}
		m, err := c.Metrics(h.ctx)
		if err != nil {
			return false, nil
		}
		held = int(m.Sum(metricHeld, nil))
		return held >= due, nil
	})
	if ok {
		h.note("the leader holds %d forced detaches by timeout, %d due", held, due)
	} else {
		h.note("the leader holds %d forced detaches by timeout, %d due: not all were held", held, due)
	}
	return held
}

// resourceVersion returns etcd's revision now (lists are served from etcd).
func (h *harness) resourceVersion() uint64 {
	h.t.Helper()
	l, err := h.client.CoreV1().Nodes().List(h.ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		h.t.Fatalf("list nodes: %v", err)
	}
	return parseRV(l.ResourceVersion)
}

// zoneSummary says what the zone faults made the leader hold.
func (h *harness) zoneSummary() string {
	due, held := 0, 0
	for _, z := range h.zoneHolds {
		due += z.due
		held += z.held
	}
	return fmt.Sprintf("; forced detaches by timeout due %d, held by the leader %d", due, held)
}

// checkZoneHolds fails the run when a zone fault made no forced detach due,
// or the leader did not hold every one: the fault would prove nothing, or
// the guard let one go.
func (h *harness) checkZoneHolds() {
	h.t.Helper()
	for i, z := range h.zoneHolds {
		if z.due == 0 || z.held < z.due {
			h.t.Errorf("zone fault %d: the leader held %d forced detaches by timeout, %d were due", i+1, z.held, z.due)
		}
	}
}
