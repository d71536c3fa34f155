package hollow

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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
	// waitTimeout bounds every step. The kubelet reports volumesInUse on
	// its 10 s status cycle and a graceful delete takes two of them; the
	// margin is for loaded CI machines.
	waitTimeout = 90 * time.Second
	// pollInterval is how often a step's condition is read: the times
	// logged are this precise.
	pollInterval = 100 * time.Millisecond
	// logTail is how much of each process's log a failed test shows.
	logTail = 6 * 1024
)

// controllerKind is the attach/detach controller a scenario runs with.
type controllerKind string

const (
	// thisController is this project's controller binary.
	thisController controllerKind = "adc"
	// kcm is kube-controller-manager's attachdetach controller, the control.
	kcm controllerKind = "kcm"
	// noController: the test plays the controller's part itself.
	noController controllerKind = "none"
)

// forEachController runs scenario once with each controller, as subtests.
func forEachController(t *testing.T, scenario func(t *testing.T, kind controllerKind)) {
	for _, kind := range []controllerKind{thisController, kcm} {
		t.Run(string(kind), func(t *testing.T) { scenario(t, kind) })
	}
}

// env is one run of a scenario: a namespace, hollow nodes and a controller.
type env struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	kind   controllerKind
	ns     string
	nodes  []*stack.HollowNode

	// controllers are every controller process the env started, the
	// running one last.
	controllers []*stack.Process
}

// newEnv creates a namespace, starts the controller of kind and nodes
// hollow nodes (side by side), named base-kind-<random>-n<i>.
func newEnv(t *testing.T, kind controllerKind, base string, nodes int, opts ...func(i int, o *stack.HollowNodeOptions)) *env {
	t.Helper()
	suffix := make([]byte, 2)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: t.Context(), client: st.Cluster.Client, kind: kind, ns: base + "-" + string(kind) + "-" + hex.EncodeToString(suffix)}
	t.Cleanup(e.cleanup)
	if _, err := framework.CreateNamespace(e.ctx, e.client, e.ns); err != nil {
		t.Fatal(err)
	}
	e.startController()

	started := time.Now()
	e.nodes = make([]*stack.HollowNode, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		o := stack.HollowNodeOptions{
			Name:   fmt.Sprintf("%s-n%d", e.ns, i),
			Labels: map[string]string{v1.LabelTopologyZone: "zone-" + string(rune('a'+i%2))},
		}
		for _, opt := range opts {
			opt(i, &o)
		}
		wg.Go(func() { e.nodes[i], errs[i] = st.StartHollowNode(e.ctx, o) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d hollow nodes Ready with their CSI drivers registered in %.1fs", nodes, time.Since(started).Seconds())
	return e
}

// startController starts the env's controller and waits until it is ready.
func (e *env) startController() {
	e.t.Helper()
	switch e.kind {
	case thisController:
		c, err := st.StartController(e.ctx)
		if c != nil {
			e.controllers = append(e.controllers, c.Process)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	case kcm:
		p, err := st.StartKubeControllerManager(e.ctx)
		if p != nil {
			e.controllers = append(e.controllers, p)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

// restartController stops the running controller (SIGTERM) and starts
// another.
func (e *env) restartController() {
	e.t.Helper()
	if err := e.controllers[len(e.controllers)-1].Stop(stack.StopGrace); err != nil {
		e.t.Fatal(err)
	}
	e.startController()
}

// cleanup deletes the namespace's pods at once and stops the test's
// processes, showing their logs if the test failed. What stays (Nodes,
// VolumeAttachments of stopped nodes) concerns no later test's nodes.
func (e *env) cleanup() {
	procs := slices.Clone(e.controllers)
	for _, n := range e.nodes {
		if n != nil {
			procs = append(procs, n.Processes()...)
		}
	}
	if e.t.Failed() {
		// The stack's attachers serve every test: shown, not stopped.
		shown := slices.Clone(procs)
		for _, p := range st.Processes() {
			if strings.HasPrefix(p.Name, "csi-attacher") {
				shown = append(shown, p)
			}
		}
		for _, p := range shown {
			e.t.Logf("--- last lines of %s (%s):\n%s", p.Name, p.LogPath, p.Tail(logTail))
		}
		e.keepLogs(shown)
	}
	for _, p := range procs {
		if err := p.Stop(stack.StopGrace); err != nil {
			e.t.Error(err)
		}
	}
}

// node is the i-th hollow node's name.
func (e *env) node(i int) string { return e.nodes[i].Name }

// csiVolume is a PVC bound to a CSI PV.
type csiVolume struct {
	claim  string
	pv     string
	driver string
	handle string
}

// name is the volume's unique name in node status, as kubelet spells it.
func (v csiVolume) name() v1.UniqueVolumeName {
	return v1.UniqueVolumeName(framework.CSIVolumeName(v.driver, v.handle))
}

// vaName is the name of the volume's VolumeAttachment on node.
func (v csiVolume) vaName(node string) string {
	return framework.VolumeAttachmentName(v.handle, v.driver, node)
}

// createVolume creates claim bound to a mock CSI volume.
func (e *env) createVolume(claim string, modes ...v1.PersistentVolumeAccessMode) csiVolume {
	e.t.Helper()
	v := csiVolume{claim: claim, driver: stack.MockDriver, handle: e.ns + "-" + claim}
	pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, claim, framework.CSISource(v.driver, v.handle), modes...)
	if err != nil {
		e.t.Fatal(err)
	}
	v.pv = pv.Name
	return v
}

// createPod creates a pod on node using the claims.
func (e *env) createPod(name, node string, claims ...string) {
	e.t.Helper()
	e.createPodWithVolumes(name, node, framework.PVCVolumes(claims...)...)
}

// createPodWithVolumes creates a pod on node whose container mounts every
// volume (framework.Pod): kubelet's volume manager sets up only the volumes
// a container uses.
func (e *env) createPodWithVolumes(name, node string, volumes ...v1.Volume) {
	e.t.Helper()
	if _, err := framework.CreatePodWithVolumes(e.ctx, e.client, e.ns, name, node, volumes...); err != nil {
		e.t.Fatal(err)
	}
}

// deletePod deletes a pod as a user does, with its grace period.
func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete pod %s/%s: %v", e.ns, name, err)
	}
}

// step is one observable outcome of a scenario, polled until it holds.
type step struct {
	what string
	cond func() (bool, error)
}

// waitSteps polls every step until all hold, and logs when each first
// held, in seconds since start, in the order they happened: "timing" lines
// a reader compares across controllers. invariant, if set, is checked at
// every poll and fails the test at once.
func (e *env) waitSteps(title string, start time.Time, invariant func() error, steps ...step) map[string]time.Duration {
	e.t.Helper()
	at := map[string]time.Duration{}
	for i, s := range steps {
		if slices.ContainsFunc(steps[:i], func(o step) bool { return o.what == s.what }) {
			e.t.Fatalf("%s: step %q given twice", title, s.what)
		}
	}
	deadline := time.Now().Add(waitTimeout)
	for {
		if invariant != nil {
			if err := invariant(); err != nil {
				e.t.Fatalf("%s: %v", title, err)
			}
		}
		for _, s := range steps {
			if _, done := at[s.what]; done {
				continue
			}
			ok, err := s.cond()
			if err != nil {
				e.t.Fatalf("%s: %s: %v", title, s.what, err)
			}
			if ok {
				at[s.what] = time.Since(start)
			}
		}
		if len(at) == len(steps) {
			break
		}
		if time.Now().After(deadline) {
			var pending []string
			for _, s := range steps {
				if _, done := at[s.what]; !done {
					pending = append(pending, s.what)
				}
			}
			e.t.Fatalf("%s: after %s, still waiting for: %s", title, waitTimeout, strings.Join(pending, "; "))
		}
		select {
		case <-e.ctx.Done():
			e.t.Fatal(e.ctx.Err())
		case <-time.After(pollInterval):
		}
	}
	order := slices.Clone(steps)
	slices.SortStableFunc(order, func(a, b step) int { return int(at[a.what] - at[b.what]) })
	for _, s := range order {
		e.t.Logf("timing %s %s: %-70s %6.2fs", e.kind, title, s.what, at[s.what].Seconds())
	}
	return at
}

// Steps, each read from the API.

func (e *env) vaAttached(v csiVolume, node string) step {
	return step{"VolumeAttachment of " + v.handle + " attached on " + node, func() (bool, error) {
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return va.Status.Attached, e.checkVA(va, v, node)
	}}
}

// checkVA checks what the controller wrote and that the attacher published
// to the node ID the node's driver reported to its kubelet.
func (e *env) checkVA(va *storagev1.VolumeAttachment, v csiVolume, node string) error {
	inline := v.pv == ""
	if va.Spec.Attacher != v.driver || va.Spec.NodeName != node ||
		(!inline && (va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != v.pv)) ||
		(inline && va.Spec.Source.InlineVolumeSpec == nil) {
		return fmt.Errorf("VolumeAttachment %s: spec %+v, want attacher %s, node %s, PV %q (empty: an inline volume spec)", va.Name, va.Spec, v.driver, node, v.pv)
	}
	if id := va.Annotations[framework.NodeIDAnnotation]; va.Status.Attached && id != e.hollow(node).NodeID(v.driver) {
		return fmt.Errorf("VolumeAttachment %s attached to node ID %q, want %q (from the node's CSINode)", va.Name, id, e.hollow(node).NodeID(v.driver))
	}
	return nil
}

func (e *env) hollow(node string) *stack.HollowNode {
	for _, n := range e.nodes {
		if n.Name == node {
			return n
		}
	}
	e.t.Fatalf("no hollow node %s", node)
	return nil
}

func (e *env) vaGone(v csiVolume, node string) step {
	return step{"VolumeAttachment of " + v.handle + " gone from " + node, func() (bool, error) {
		_, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}}
}

func (e *env) nodeStatus(what string, node string, check func(*v1.Node) bool) step {
	return step{what, func() (bool, error) {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return check(n), nil
	}}
}

func (e *env) listedAttached(v csiVolume, node string, want bool) step {
	return e.listedAttachedName(v.name(), node, want)
}

func (e *env) listedAttachedName(name v1.UniqueVolumeName, node string, want bool) step {
	what := "volumesAttached of " + node + " lists " + string(name)
	if !want {
		what = "volumesAttached of " + node + " drops " + string(name)
	}
	return e.nodeStatus(what, node, func(n *v1.Node) bool { return attached(n, name) == want })
}

func (e *env) listedInUse(v csiVolume, node string, want bool) step {
	return e.listedInUseName(v.name(), node, want)
}

func (e *env) listedInUseName(name v1.UniqueVolumeName, node string, want bool) step {
	what := "volumesInUse of " + node + " lists " + string(name) + " (kubelet)"
	if !want {
		what = "volumesInUse of " + node + " drops " + string(name) + " (kubelet)"
	}
	return e.nodeStatus(what, node, func(n *v1.Node) bool { return slices.Contains(n.Status.VolumesInUse, name) == want })
}

func (e *env) podRunning(name string) step {
	return step{"pod " + name + " Running (kubelet mounted its volumes)", func() (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == v1.PodRunning, nil
	}}
}

func (e *env) podGone(name string) step {
	return step{"pod " + name + " gone (kubelet unmounted)", func() (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	}}
}

func attached(n *v1.Node, name v1.UniqueVolumeName) bool {
	return slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == name })
}

// attachedOn says whether v's VolumeAttachment on node exists and is
// attached, or the node's volumesAttached lists v.
func (e *env) attachedOn(v csiVolume, node string) (bool, error) {
	va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, err
	case va.Status.Attached:
		return true, nil
	}
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return attached(n, v.name()), nil
}

// keepLogs copies the logs of procs where they outlive the stack's
// directory, and says where.
func (e *env) keepLogs(procs []*stack.Process) {
	dir, err := os.MkdirTemp("", "hollow-logs-"+e.ns+"-")
	if err != nil {
		e.t.Log(err)
		return
	}
	for _, p := range procs {
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
