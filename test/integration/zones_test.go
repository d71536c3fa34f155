package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A partition is not a mass death: while most managed nodes of a zone are
// not Ready, the forced detaches by timeout of its nodes are held
// (reconciler.ZoneDisrupted), whatever happened to their pods; a single dead
// node, the out-of-service taint and an unmount still detach.

const (
	// zoneMaxWait is the max wait for unmount of these tests: a forced
	// detach by timeout is due seconds after a pod goes.
	zoneMaxWait = 5 * time.Second

	metricDisruptedZones = "attachdetach_controller_disrupted_zones"
	metricHeld           = "attachdetach_controller_forced_detaches_held"
	metricForced         = "attach_detach_controller_attachdetach_controller_forced_detaches"
)

// plainEndpoint stands in for the secure endpoint (app.SecureServing): it
// serves the same handlers, /explain and /metrics, in plain HTTP on
// loopback without authentication. Who may read them is the real
// endpoint's concern, tested in test/integration/process.
type plainEndpoint struct {
	ln net.Listener
}

var _ app.SecureServing = (*plainEndpoint)(nil)

func (p *plainEndpoint) AddFlags(*pflag.FlagSet) {}

func (p *plainEndpoint) Validate() []error { return nil }

func (p *plainEndpoint) Serve(ctx context.Context, _ string, h http.Handler) (func(), error) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(p.ln); !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Test endpoint failed")
		}
	}()
	return func() {
		_ = srv.Close() // nothing left to serve
		<-done
	}, nil
}

// zoneSpec is a zone of a test and its number of managed nodes.
type zoneSpec struct {
	name  string
	nodes int
}

// zoneNode is a managed node with a pod using a ReadWriteOnce CSI volume of
// its own, attached and mounted.
type zoneNode struct {
	name, zone, pod, handle string
}

// zoneFixture is a controller and zones of nodes, each with its volume.
type zoneFixture struct {
	e        *env
	driver   string
	endpoint string // http://host:port of the controller's handlers
	nodes    []zoneNode
	ctrl     *framework.Controller
}

// startZones starts a controller whose max wait for unmount is zoneMaxWait
// (configure may change its options), and creates the zones' nodes (their
// label unique to the test), each with its pod and volume, attached and in
// node.status.volumesInUse.
func startZones(t *testing.T, base string, configure func(*app.Options), zones ...zoneSpec) *zoneFixture {
	t.Helper()
	e := newEnv(t, base)
	f := &zoneFixture{e: e, driver: e.name("csi.test")}
	e.startAttacher(f.driver, "")
	f.start(configure)

	for _, z := range zones {
		for i := range z.nodes {
			id := fmt.Sprintf("%s-%d", z.name, i)
			n := zoneNode{name: e.name("node-" + id), zone: e.name(z.name), pod: "pod-" + id, handle: "vol-" + id}
			node := framework.Node(n.name)
			node.Labels = map[string]string{v1.LabelTopologyZone: n.zone}
			if _, err := framework.CreateNode(e.ctx, e.client, node); err != nil {
				t.Fatal(err)
			}
			e.remember(func(ctx context.Context) error {
				return e.client.CoreV1().Nodes().Delete(ctx, n.name, metav1.DeleteOptions{})
			})
			e.createCSIClaim("claim-"+id, f.driver, n.handle)
			// Mounted from before the attach, as kubelet reports it: the
			// controller has long seen it when the pod goes.
			e.setVolumesInUse(n.name, f.volume(n))
			e.createPod(n.pod, n.name, "claim-"+id)
			f.nodes = append(f.nodes, n)
		}
	}
	for _, n := range f.nodes {
		e.waitAttached(f.driver, n.handle, n.name)
	}
	return f
}

// start starts a controller whose max wait for unmount is zoneMaxWait
// (configure may change its options), its handlers on a new endpoint.
func (f *zoneFixture) start(configure func(*app.Options)) {
	t := f.e.t
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() }) // closed already once served
	f.endpoint = "http://" + ln.Addr().String()
	f.ctrl = f.e.startController(func(o *app.Options) {
		o.MaxWaitForUnmount = zoneMaxWait
		o.Serving = &plainEndpoint{ln: ln}
		if configure != nil {
			configure(o)
		}
	})
}

func (f *zoneFixture) volume(n zoneNode) string { return framework.CSIVolumeName(f.driver, n.handle) }

// kill makes the nodes NotReady, all of them first, then force-deletes
// their pods, as an operator might when a zone stops reporting. It returns
// when the last pod was deleted.
func (f *zoneFixture) kill(nodes ...zoneNode) time.Time {
	f.e.t.Helper()
	for _, n := range nodes {
		f.e.setNodeReady(n.name, false)
	}
	for _, n := range nodes {
		f.e.deletePod(n.pod)
	}
	return time.Now()
}

// attachedCheck watches the nodes' VolumeAttachments and node statuses from
// now on; check (for framework.Consistently) fails once one of the volumes
// was detached or withdrawn from its node's status, however briefly.
type attachedCheck struct {
	vas   []*vaWatch
	nodes map[string]*nodeWatch
	names map[string]string // node -> volume
}

func (f *zoneFixture) watchAttached(nodes ...zoneNode) *attachedCheck {
	f.e.t.Helper()
	c := f.watchVAs(nodes...)
	for _, n := range nodes {
		c.nodes[n.name] = f.e.watchNode(n.name)
		c.names[n.name] = f.volume(n)
	}
	return c
}

// watchVAs is watchAttached of the VolumeAttachments alone: for nodes
// about to be deleted, whose status goes with them.
func (f *zoneFixture) watchVAs(nodes ...zoneNode) *attachedCheck {
	f.e.t.Helper()
	c := &attachedCheck{nodes: map[string]*nodeWatch{}, names: map[string]string{}}
	for _, n := range nodes {
		va, ok, err := f.e.getVA(framework.VolumeAttachmentName(n.handle, f.driver, n.name))
		if err != nil || !ok {
			f.e.t.Fatalf("VolumeAttachment of %s on node %s: found %v, %v", n.handle, n.name, ok, err)
		}
		c.vas = append(c.vas, f.e.watchVA(va))
	}
	return c
}

func (c *attachedCheck) check() error {
	var errs []error
	for _, vw := range c.vas {
		errs = append(errs, vw.intact())
	}
	for node, nw := range c.nodes {
		if m := nw.missing(c.names[node]); len(m) != 0 {
			errs = append(errs, fmt.Errorf("node %s: %v", node, m))
		}
	}
	return errors.Join(errs...)
}

// close stops the watches, before the volumes may go.
func (c *attachedCheck) close() {
	for _, vw := range c.vas {
		vw.close()
	}
	for _, nw := range c.nodes {
		nw.stop()
		<-nw.done
	}
}

// metricWant is the value a metric should have: the sum of its samples,
// of those with labels when given.
type metricWant struct {
	name   string
	labels map[string]string
	value  float64
}

func (w metricWant) String() string {
	var labels []string
	for k, v := range w.labels {
		labels = append(labels, fmt.Sprintf("%s=%q", k, v))
	}
	slices.Sort(labels)
	if len(labels) == 0 {
		return fmt.Sprintf("%s %v", w.name, w.value)
	}
	return fmt.Sprintf("%s{%s} %v", w.name, strings.Join(labels, ","), w.value)
}

func forcedDetaches(reason string, value float64) metricWant {
	return metricWant{name: metricForced, labels: map[string]string{"reason": reason}, value: value}
}

// waitMetrics waits until the controller's metrics have the values of want.
func (f *zoneFixture) waitMetrics(want ...metricWant) {
	f.e.t.Helper()
	var got []metricWant
	ok := framework.Poll(f.e.t, waitTimeout, func() (bool, error) {
		m, err := framework.ScrapeMetrics(f.e.ctx, f.endpoint+"/metrics")
		if err != nil {
			return false, nil // not serving yet
		}
		got = got[:0]
		same := true
		for _, w := range want {
			g := w
			g.value = m.Sum(w.name, w.labels)
			got = append(got, g)
			same = same && g.value == w.value
		}
		return same, nil
	})
	if !ok {
		f.e.t.Fatalf("metrics after %s: %v, want %v", waitTimeout, got, want)
	}
}

// explain asks /explain about the node's volume there.
func (f *zoneFixture) explain(n zoneNode) (controller.Explanation, error) {
	var e controller.Explanation
	q := url.Values{"volume": {f.volume(n)}, "node": {n.name}}
	ctx, cancel := context.WithTimeout(f.e.ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.endpoint+"/explain?"+q.Encode(), nil)
	if err != nil {
		return e, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return e, fmt.Errorf("explain %s on %s: %w", n.handle, n.name, err)
	}
	defer func() { _ = resp.Body.Close() }() // read fully below
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return e, fmt.Errorf("explain %s on %s: %w", n.handle, n.name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return e, fmt.Errorf("explain %s on %s: status %s: %s", n.handle, n.name, resp.Status, body)
	}
	if err := json.Unmarshal(body, &e); err != nil {
		return e, fmt.Errorf("explain %s on %s: %w: %s", n.handle, n.name, err, body)
	}
	return e, nil
}

// waitExplained waits until /explain gives each node's volume the reason
// reason(node).
func (f *zoneFixture) waitExplained(nodes []zoneNode, reason func(zoneNode) string) {
	f.e.t.Helper()
	for _, n := range nodes {
		var last controller.Explanation
		ok := framework.Poll(f.e.t, waitTimeout, func() (bool, error) {
			e, err := f.explain(n)
			last = e
			return err == nil && e.Reason == reason(n), nil
		})
		if !ok {
			f.e.t.Fatalf("/explain of %s on %s after %s: %s %q, want reason %q", n.handle, n.name, waitTimeout, last.Action, last.Reason, reason(n))
		}
	}
}

// waitZoneEvent waits for an event of the type and reason on one of the
// zone's nodes (events of cluster-scoped objects are in namespace default)
// whose message starts with prefix, and returns its message.
func (f *zoneFixture) waitZoneEvent(zone, eventType, reason, prefix string) string {
	f.e.t.Helper()
	inZone := map[string]bool{}
	for _, n := range f.nodes {
		if n.zone == zone {
			inZone[n.name] = true
		}
	}
	var message string
	var seen []string
	ok := framework.Poll(f.e.t, waitTimeout, func() (bool, error) {
		list, err := f.e.client.CoreV1().Events(metav1.NamespaceDefault).List(f.e.ctx, metav1.ListOptions{
			FieldSelector: fields.AndSelectors(
				fields.OneTermEqualSelector("involvedObject.kind", "Node"),
				fields.OneTermEqualSelector("reason", reason),
			).String(),
		})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range list.Items {
			if !inZone[ev.InvolvedObject.Name] {
				continue
			}
			seen = append(seen, fmt.Sprintf("%s %s on %s: %q", ev.Type, ev.Reason, ev.InvolvedObject.Name, ev.Message))
			if ev.Type == eventType && strings.HasPrefix(ev.Message, prefix) {
				message = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if !ok {
		f.e.t.Fatalf("no %s event %s starting with %q on a node of zone %s after %s; seen: %q", eventType, reason, prefix, zone, waitTimeout, seen)
	}
	return message
}

// heldReason is /explain's reason for a forced detach held on node n.
func heldReason(unhealthy, nodes int) func(zoneNode) string {
	return func(n zoneNode) string {
		return fmt.Sprintf("still mounted on unhealthy node %s; forced detach held: zone %q is disrupted: %d of %d nodes not ready, threshold 55%%",
			n.name, n.zone, unhealthy, nodes)
	}
}

// One node of ten NotReady, its pod force-deleted: the zone is not
// disrupted, and the volume still mounted there is force-detached once the
// max wait for unmount has passed, as it always was.
func TestZoneOneDeadNodeForceDetached(t *testing.T) {
	f := startZones(t, "zone-one", nil, zoneSpec{"a", 10})
	dead, alive := f.nodes[0], f.nodes[1:]
	kept := f.watchAttached(alive...)

	deleted := f.kill(dead)
	f.e.waitDetached(f.driver, dead.handle, dead.name)
	if elapsed := time.Since(deleted); elapsed < zoneMaxWait {
		t.Errorf("mounted volume detached %s after its pod was deleted, before the max wait for unmount (%s)", elapsed, zoneMaxWait)
	}
	f.waitMetrics(forcedDetaches("timeout", 1), metricWant{name: metricDisruptedZones}, metricWant{name: metricHeld})
	if err := kept.check(); err != nil {
		t.Errorf("the volumes of the nine Ready nodes: %v", err)
	}
}

// Eight nodes of ten NotReady at once, their pods force-deleted: nothing is
// detached for twice the max wait for unmount, and the metrics, /explain
// and an event say why. Their kubelets unmount: every volume is detached,
// none forced. The nodes come back Ready: the zone's recovery is told.
func TestZoneDisruptedHoldsForcedDetaches(t *testing.T) {
	f := startZones(t, "zone-hold", nil, zoneSpec{"a", 10})
	dead := f.nodes[:8]
	zone := dead[0].zone
	kept := f.watchAttached(dead...)

	deleted := f.kill(dead...)
	framework.Consistently(t, 2*zoneMaxWait, kept.check, "the volumes of the zone's NotReady nodes to stay attached")
	t.Logf("Nothing detached %s after the pods were deleted", time.Since(deleted).Round(time.Millisecond))
	kept.close()

	f.waitMetrics(metricWant{name: metricDisruptedZones, value: 1}, metricWant{name: metricHeld, value: 8})
	f.waitExplained(dead, heldReason(8, 10))
	msg := f.waitZoneEvent(zone, v1.EventTypeWarning, "ZoneDisrupted", fmt.Sprintf("zone %q is disrupted: ", zone))
	t.Logf("ZoneDisrupted: %s", msg)

	// An unmount is a signal of its own: no forced detach is needed.
	for _, n := range dead {
		f.e.setVolumesInUse(n.name)
	}
	for _, n := range dead {
		f.e.waitDetached(f.driver, n.handle, n.name)
	}
	f.waitMetrics(metricWant{name: metricForced}, metricWant{name: metricDisruptedZones, value: 1}, metricWant{name: metricHeld})

	for _, n := range dead {
		f.e.setNodeReady(n.name, true)
	}
	msg = f.waitZoneEvent(zone, v1.EventTypeNormal, "ZoneRecovered", fmt.Sprintf("zone %q is not disrupted: ", zone))
	t.Logf("ZoneRecovered: %s", msg)
	f.waitMetrics(metricWant{name: metricDisruptedZones}, metricWant{name: metricHeld}, metricWant{name: metricForced})
}

// The out-of-service taint on a node of a disrupted zone detaches its
// volume at once, while the forced detaches by timeout of the zone's other
// nodes stay held.
func TestZoneDisruptedOutOfServiceDetaches(t *testing.T) {
	f := startZones(t, "zone-oos", nil, zoneSpec{"a", 10})
	dead := f.nodes[:8]
	f.kill(dead...)
	// Due and held: only the taint can detach now.
	f.waitMetrics(metricWant{name: metricDisruptedZones, value: 1}, metricWant{name: metricHeld, value: 8})

	tainted, rest := dead[0], dead[1:]
	kept := f.watchAttached(rest...)
	f.e.updateNode(tainted.name, func(n *v1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{
			Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute,
		})
	})
	taintedAt := time.Now()
	f.e.waitDetached(f.driver, tainted.handle, tainted.name)
	t.Logf("Detached %s after the taint", time.Since(taintedAt).Round(time.Millisecond))

	f.waitMetrics(forcedDetaches("out-of-service", 1), forcedDetaches("timeout", 0),
		metricWant{name: metricDisruptedZones, value: 1}, metricWant{name: metricHeld, value: 7})
	framework.Consistently(t, quietPeriod, kept.check, "the volumes of the zone's other NotReady nodes to stay attached")
	f.waitExplained(rest, heldReason(8, 10))
}

// Two zones: in zone a four nodes of five are NotReady, in zone b one. Zone
// a's forced detaches are held; zone b's dead node is force-detached after
// the max wait for unmount, as if zone a were fine.
func TestZoneDisruptionHoldsOnlyItsZone(t *testing.T) {
	f := startZones(t, "zone-two", nil, zoneSpec{"a", 5}, zoneSpec{"b", 5})
	deadA, deadB := f.nodes[:4], f.nodes[5]
	kept := f.watchAttached(deadA...)

	deleted := f.kill(append(slices.Clone(deadA), deadB)...)
	f.e.waitDetached(f.driver, deadB.handle, deadB.name)
	if elapsed := time.Since(deleted); elapsed < zoneMaxWait {
		t.Errorf("the volume of zone b's dead node detached %s after its pod was deleted, before the max wait for unmount (%s)", elapsed, zoneMaxWait)
	}
	if rest := 2*zoneMaxWait - time.Since(deleted); rest > 0 {
		framework.Consistently(t, rest, kept.check, "the volumes of zone a's NotReady nodes to stay attached")
	}
	if err := kept.check(); err != nil {
		t.Fatalf("zone a's volumes: %v", err)
	}

	f.waitMetrics(forcedDetaches("timeout", 1), metricWant{name: metricDisruptedZones, value: 1}, metricWant{name: metricHeld, value: 4})
	f.waitExplained(deadA, heldReason(4, 5))
}

// With the guard off (--disable-zone-disruption-guard), eight nodes of ten
// NotReady are force-detached once the max wait for unmount has passed.
func TestZoneGuardDisabled(t *testing.T) {
	f := startZones(t, "zone-off", func(o *app.Options) { o.DisableZoneDisruptionGuard = true }, zoneSpec{"a", 10})
	dead := f.nodes[:8]

	deleted := f.kill(dead...)
	f.e.waitDetached(f.driver, dead[0].handle, dead[0].name)
	if elapsed := time.Since(deleted); elapsed < zoneMaxWait {
		t.Errorf("mounted volume detached %s after its pod was deleted, before the max wait for unmount (%s)", elapsed, zoneMaxWait)
	}
	for _, n := range dead[1:] {
		f.e.waitDetached(f.driver, n.handle, n.name)
	}
	t.Logf("All detached %s after the pods were deleted", time.Since(deleted).Round(time.Millisecond))
	f.waitMetrics(forcedDetaches("timeout", 8), metricWant{name: metricDisruptedZones}, metricWant{name: metricHeld})
}

// Nodes of a disrupted zone come back Ready with their volumes still
// mounted, one status write after another as kubelets report: no volume is
// detached, neither while some of them are still NotReady after the zone
// has recovered, nor once they are all Ready. Their kubelets unmount: every
// volume is detached, none forced.
func TestZoneRecoveryKeepsVolumesOfReturningNodes(t *testing.T) {
	f := startZones(t, "zone-back", nil, zoneSpec{"a", 10})
	dead := f.nodes[:8]
	zone := dead[0].zone
	f.kill(dead...)
	// Due and held.
	f.waitMetrics(metricWant{name: metricDisruptedZones, value: 1}, metricWant{name: metricHeld, value: 8})

	kept := f.watchAttached(dead...)
	for _, n := range dead {
		f.e.setNodeReady(n.name, true)
	}
	msg := f.waitZoneEvent(zone, v1.EventTypeNormal, "ZoneRecovered", fmt.Sprintf("zone %q is not disrupted: ", zone))
	t.Logf("ZoneRecovered: %s", msg)
	f.waitMetrics(metricWant{name: metricDisruptedZones}, metricWant{name: metricHeld})
	framework.Consistently(t, zoneMaxWait, kept.check, "the volumes mounted on the nodes back Ready to stay attached")
	kept.close()

	for _, n := range dead {
		f.e.setVolumesInUse(n.name)
	}
	for _, n := range dead {
		f.e.waitDetached(f.driver, n.handle, n.name)
	}
	f.waitMetrics(metricWant{name: metricForced})
}

// A partition in zone a (two of six nodes NotReady, their pods gone) while
// the controller is down, and three more of its nodes deleted meanwhile
// (the leader may well have been in the cut-off zone): the controller that
// starts never read those three, nor their zone. Their deletions count in
// every zone, so zone a is disrupted (5 of 6 not ready) and nothing is
// force-detached while it is, neither on the NotReady nodes nor on the
// deleted ones; /explain and the metrics say why. Once the deletions stop
// counting (--max-wait-for-unmount-deleted-node after the start), the zone
// recovers and its nodes get the max wait again before a forced detach.
func TestZoneRestartWithNodesDeletedBefore(t *testing.T) {
	deletedWait := 4 * zoneMaxWait
	configure := func(o *app.Options) { o.MaxWaitForUnmountDeletedNode = &deletedWait }
	f := startZones(t, "zone-restart", configure, zoneSpec{"a", 6})
	notReady, deleted := f.nodes[:2], f.nodes[2:5]
	zone := notReady[0].zone
	if err := f.ctrl.Stop(30 * time.Second); err != nil {
		t.Fatalf("stop the controller: %v", err)
	}
	kept, keptVAs := f.watchAttached(notReady...), f.watchVAs(deleted...)
	f.kill(append(slices.Clone(notReady), deleted...)...)
	for _, n := range deleted {
		if err := f.e.client.CoreV1().Nodes().Delete(f.e.ctx, n.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f.start(configure)
	started := time.Now()
	// Serving: the actual state is rebuilt, the zones looked at: zone a,
	// and the nodes deleted before the start, 3 of 3 on their own.
	f.waitMetrics(metricWant{name: metricDisruptedZones, value: 2})

	// The NotReady nodes' forced detaches are due (the max wait has
	// passed since the start) and held; the deleted nodes wait longer.
	f.waitMetrics(metricWant{name: metricDisruptedZones, value: 2}, metricWant{name: metricHeld, value: 2}, metricWant{name: metricForced})
	f.waitExplained(notReady, heldReason(5, 6))
	msg := f.waitZoneEvent(zone, v1.EventTypeWarning, "ZoneDisrupted", fmt.Sprintf("zone %q is disrupted: 5 of 6 nodes not ready", zone))
	t.Logf("ZoneDisrupted: %s", msg)
	if rest := 3*zoneMaxWait - time.Since(started); rest > 0 {
		framework.Consistently(t, rest, func() error { return errors.Join(kept.check(), keptVAs.check()) },
			"the volumes of the NotReady and deleted nodes to stay attached")
	}
	if err := errors.Join(kept.check(), keptVAs.check()); err != nil {
		t.Fatalf("the volumes of the NotReady and deleted nodes: %v", err)
	}
	t.Logf("Nothing detached %s after the start", time.Since(started).Round(time.Millisecond))
	kept.close()
	keptVAs.close()

	// The deletions stop counting: the zone recovers, and the max wait
	// starts again from then.
	for _, n := range notReady {
		f.e.waitDetached(f.driver, n.handle, n.name)
	}
	for _, n := range deleted {
		name := framework.VolumeAttachmentName(n.handle, f.driver, n.name)
		if !framework.Poll(t, waitTimeout, func() (bool, error) {
			_, ok, err := f.e.getVA(name)
			return !ok, err
		}) {
			t.Fatalf("VolumeAttachment %s of deleted node %s still there after %s", name, n.name, waitTimeout)
		}
	}
	if elapsed := time.Since(started); elapsed < deletedWait+zoneMaxWait {
		t.Errorf("forced detaches %s after the start, want them after the deleted nodes' wait and a fresh max wait (%s)", elapsed, deletedWait+zoneMaxWait)
	}
	f.waitMetrics(metricWant{name: metricDisruptedZones}, metricWant{name: metricHeld}, forcedDetaches("timeout", 5))
}
