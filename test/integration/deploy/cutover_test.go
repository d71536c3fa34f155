package deploy

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestCutOver follows docs/operations.md against the real API server:
// kube-controller-manager's attachdetach controller attaches volumes; it is
// stopped and this controller, deployed as the manifests say, takes over; then
// back. From start to end a watch on the VolumeAttachments and the node
// asserts that no VolumeAttachment of a pod that still runs is deleted and
// that node.status.volumesAttached never drops its volume: not a single
// detach. Each controller also proves it is in charge by attaching a new pod
// and detaching a deleted one.
//
// kube-controller-manager runs only its attachdetach controller here, so
// restarting it with --controllers=*,-attachdetach, as a cluster does, is
// stopping it.
func TestCutOver(t *testing.T) {
	r := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, r)
	s := newScene(t, "cutover", "")
	guard := watchForDetaches(t, s)

	// The built-in controller attaches two pods' volumes; kubelet mounts them.
	one, two := s.volume("one", "handle-one"), s.volume("two", "handle-two")
	s.createClaim(one)
	s.createClaim(two)
	kcm := startKubeControllerManager(t)
	for _, v := range []volume{one, two} {
		s.startPod(v)
		s.waitAttached(v)
		s.waitReported(v, true)
		guard.protect(v)
	}
	s.setInUse(s.node, one, two)
	before := snapshotState(t, s)
	t.Logf("kube-controller-manager attached: %v", before)

	// Cut-over: stop the built-in controller, then start this one.
	kcm.stop(t)
	ours := startController(t, r, kubeconfig, nil)
	waitStarted(t, ours)
	waitSettled(t, ours, s, 2)
	if after := snapshotState(t, s); !after.equal(before) {
		t.Errorf("state changed when this controller took over:\nbefore %v\nafter  %v", before, after)
	}

	// This controller is in charge: it attaches a new pod's volume and
	// detaches the volume of a deleted pod, once unmounted.
	three := s.volume("three", "handle-three")
	s.createPod(three)
	s.waitAttached(three)
	s.waitReported(three, true)
	guard.protect(three)
	s.setInUse(s.node, two, three)
	guard.release(one)
	s.deletePod(one)
	s.waitDetached(one)
	s.waitReported(one, false)
	waitSettled(t, ours, s, 2)
	middle := snapshotState(t, s)

	// And back: stop this controller, start the built-in one again.
	stopController(t, ours)
	four := s.volume("four", "handle-four")
	s.createClaim(four)
	kcm = startKubeControllerManager(t)
	s.startPod(four)
	s.waitAttached(four)
	s.waitReported(four, true)
	guard.protect(four)
	s.setInUse(s.node, two, three, four)
	// Nothing the other controller attached was touched.
	for _, v := range []volume{two, three} {
		va, err := s.attachment(v)
		if err != nil {
			t.Fatal(err)
		}
		if va == nil || string(va.UID) != middle.attachments[v.attachment] {
			t.Errorf("VolumeAttachment %s of %s replaced or gone after the way back", v.attachment, v.name)
		}
	}
	s.setInUse(s.node, three, four)
	guard.release(two)
	s.deletePod(two)
	s.waitDetached(two)
	s.waitReported(two, false)
	kcm.stop(t)
	guard.check(t)
}

// kubeControllerManager is a kube-controller-manager running only its
// attachdetach controller.
type kubeControllerManager struct {
	p *framework.Process
}

// startKubeControllerManager starts kube-controller-manager with the admin
// kubeconfig (framework.KubeControllerManagerArgs). It returns once the
// controller's caches are synced (framework.KubeControllerManagerSynced).
func startKubeControllerManager(t *testing.T) *kubeControllerManager {
	t.Helper()
	p := framework.StartProcess(t, tools.kubeControllerManager,
		framework.KubeControllerManagerArgs(cluster.Kubeconfig, t.TempDir())...)
	framework.Eventually(t, startTimeout, func() (bool, error) {
		select {
		case <-p.Done():
			return false, fmt.Errorf("kube-controller-manager exited: %v", p.Cmd.ProcessState)
		default:
		}
		return framework.KubeControllerManagerSynced(p.Output()), nil
	}, "kube-controller-manager's attachdetach controller synced")
	return &kubeControllerManager{p: p}
}

func (k *kubeControllerManager) stop(t *testing.T) {
	t.Helper()
	if err := k.p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-k.p.Done():
	case <-time.After(stopTimeout):
		t.Fatalf("kube-controller-manager still running %s after SIGTERM", stopTimeout)
	}
}

// state is what a cut-over must not change: the VolumeAttachments (name to
// UID) and node.status.volumesAttached (name to device path).
type state struct {
	attachments map[string]string
	reported    map[string]string
}

func (s state) equal(o state) bool {
	return maps.Equal(s.attachments, o.attachments) && maps.Equal(s.reported, o.reported)
}

func (s state) String() string {
	return fmt.Sprintf("VolumeAttachments %v, volumesAttached %v", s.attachments, s.reported)
}

func snapshotState(t *testing.T, s *scene) state {
	t.Helper()
	st := state{attachments: map[string]string{}, reported: map[string]string{}}
	vas, err := s.client.StorageV1().VolumeAttachments().List(s.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		if va.Spec.NodeName == s.node {
			st.attachments[va.Name] = string(va.UID)
		}
	}
	node, err := s.client.CoreV1().Nodes().Get(s.ctx, s.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, av := range node.Status.VolumesAttached {
		st.reported[string(av.Name)] = av.DevicePath
	}
	return st
}

// waitSettled waits until the controller's metrics show the scene's volumes
// both desired and attached, and its queues empty: it has looked at
// everything and has nothing left to do.
func waitSettled(t *testing.T, c *framework.Controller, s *scene, volumes int) {
	t.Helper()
	plugin := "kubernetes.io/csi:" + s.driver
	want := []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"attachdetach_controller_total_volumes", map[string]string{"plugin_name": plugin, "state": "desired_state_of_world"}, float64(volumes)},
		{"attachdetach_controller_total_volumes", map[string]string{"plugin_name": plugin, "state": "actual_state_of_world"}, float64(volumes)},
		{"workqueue_depth", map[string]string{"name": "volumes"}, 0},
		{"workqueue_depth", map[string]string{"name": "nodestatus"}, 0},
		{"workqueue_depth", map[string]string{"name": "pods"}, 0},
	}
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		got, err := framework.ScrapeMetrics(t.Context(), c.HTTPURL+"/metrics")
		if err != nil {
			return false, nil
		}
		for _, w := range want {
			// One series each, with exactly these labels.
			if m := got.Select(w.name, w.labels); len(m) != 1 || len(m[0].Labels) != len(w.labels) || m[0].Value != w.value {
				return false, nil
			}
		}
		return true, nil
	}, "%d volumes desired and attached, queues empty", volumes)
}

// detachGuard watches, for the whole test, the VolumeAttachments and the
// node of a scene, and records every deletion of a protected volume's
// VolumeAttachment and every node status that drops a protected volume.
type detachGuard struct {
	mu        sync.Mutex
	protected map[string]volume // by attachment name
	// listed is the node's volumesAttached as of the last node event; seen
	// holds the protected volumes an event has listed since they were
	// protected. Only a drop after that counts: an older event, still in
	// flight when the volume was protected, is no drop.
	listed     map[string]bool
	seen       map[string]bool
	violations []string
}

func watchForDetaches(t *testing.T, s *scene) *detachGuard {
	t.Helper()
	g := &detachGuard{protected: map[string]volume{}, listed: map[string]bool{}, seen: map[string]bool{}}
	ctx, cancel := context.WithCancel(context.Background())
	vaWatch, err := s.client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nodeWatch, err := s.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", s.node).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev := range vaWatch.ResultChan() {
			va, ok := ev.Object.(*storagev1.VolumeAttachment)
			if !ok {
				continue
			}
			switch {
			case ev.Type == watch.Deleted:
				g.violate(va.Name, "VolumeAttachment %s deleted", va.Name)
			case va.DeletionTimestamp != nil:
				g.violate(va.Name, "VolumeAttachment %s being deleted", va.Name)
			}
		}
	})
	wg.Go(func() {
		for ev := range nodeWatch.ResultChan() {
			node, ok := ev.Object.(*v1.Node)
			if !ok {
				continue
			}
			listed := map[string]bool{}
			for _, av := range node.Status.VolumesAttached {
				listed[string(av.Name)] = true
			}
			g.mu.Lock()
			g.listed = listed
			for _, v := range g.protected {
				switch {
				case listed[v.unique]:
					g.seen[v.unique] = true
				case g.seen[v.unique]:
					g.violations = append(g.violations, fmt.Sprintf("node %s status.volumesAttached dropped %s (resourceVersion %s)", node.Name, v.unique, node.ResourceVersion))
				}
			}
			g.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return g
}

// protect starts guarding v: it is attached and reported, and its pod runs.
func (g *detachGuard) protect(v volume) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.protected[v.attachment] = v
	g.seen[v.unique] = g.listed[v.unique]
}

// release stops guarding v, before its pod is deleted.
func (g *detachGuard) release(v volume) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.protected, v.attachment)
	delete(g.seen, v.unique)
}

func (g *detachGuard) violate(attachment, format string, args ...any) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.protected[attachment]; ok {
		g.violations = append(g.violations, fmt.Sprintf(format, args...))
	}
}

func (g *detachGuard) check(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, v := range slices.Compact(g.violations) {
		t.Error(v)
	}
}
