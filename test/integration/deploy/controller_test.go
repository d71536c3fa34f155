package deploy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// controllerUser is the service account of the rendered manifests.
	controllerUser = "system:serviceaccount:kube-system:attach-detach-controller"
	// waitTimeout bounds each wait for a controller to act; it acts within
	// a second or two, the rest is margin for a loaded machine.
	waitTimeout = 30 * time.Second
	// stopTimeout bounds a graceful stop: workers stop, the Lease is
	// released.
	stopTimeout = 20 * time.Second
	// startTimeout bounds kube-controller-manager's start, up to its caches
	// synced, on a loaded machine.
	startTimeout = time.Minute
)

// startController runs the binary as the Deployment runs it: with the
// container's arguments, except that the HTTP endpoint listens on a free
// loopback port and the Lease is short, so that a successor in the next test
// does not wait long after a replica that was killed. extraArgs are
// appended, env ("NAME=value") is added to its environment.
func startController(t *testing.T, r *rendered, kubeconfig string, extraArgs []string, env ...string) *framework.Controller {
	t.Helper()
	var args []string
	for _, a := range r.args(t) {
		if !strings.HasPrefix(a, "--http-endpoint=") && !strings.HasPrefix(a, "--secure-port=") {
			args = append(args, a)
		}
	}
	args = append(args,
		// The secure port and its readers are tested in
		// test/integration/process; here the plain endpoint is scraped.
		"--secure-port=0",
		"--leader-elect-lease-duration=4s",
		"--leader-elect-renew-deadline=3s",
		"--leader-elect-retry-period=500ms",
	)
	return framework.StartControllerT(t, framework.ControllerOptions{
		Binary:     binary,
		Kubeconfig: kubeconfig,
		HTTP:       true,
		Args:       append(args, extraArgs...),
		Env:        env,
	})
}

// waitStarted waits until the controller leads and its workers run.
func waitStarted(t *testing.T, c *framework.Controller) {
	t.Helper()
	framework.Eventually(t, waitTimeout, func() (bool, error) {
		if err := c.Err(); err != nil {
			return false, err
		}
		out := c.Output()
		return strings.Contains(out, `"Became leader"`) && strings.Contains(out, `"Started"`), nil
	}, "the controller to lead and start its workers")
}

// stopController stops the controller as the kubelet does (SIGTERM) and
// fails the test unless it exits with code 0 within stopTimeout.
func stopController(t *testing.T, c *framework.Controller) {
	t.Helper()
	if err := c.Stop(stopTimeout); err != nil {
		t.Fatal(err)
	}
}

// scene is one test's corner of the shared cluster: a namespace, a managed
// Ready node, and a CSI driver with a test attacher, all named after the
// test. Everything is deleted when the test ends.
type scene struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	ns     string
	node   string
	driver string
}

func newScene(t *testing.T, base, failPrefix string) *scene {
	t.Helper()
	suffix := make([]byte, 2)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	name := base + "-" + hex.EncodeToString(suffix)
	s := &scene{t: t, ctx: t.Context(), client: cluster.Client, ns: name, node: name + "-node", driver: name + ".csi.test"}
	if _, err := framework.CreateNamespace(s.ctx, s.client, s.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.cleanup)
	if _, err := framework.CreateNode(s.ctx, s.client, framework.Node(s.node)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreateCSIDriver(s.ctx, s.client, s.driver, nil); err != nil {
		t.Fatal(err)
	}
	framework.StartAttacher(t, s.client, framework.AttacherOptions{Drivers: []string{s.driver}, FailPrefix: failPrefix})
	return s
}

// cleanup deletes what the scene created, after the test's controllers and
// attachers have stopped (cleanups run last in, first out), so that later
// tests' controllers don't see it. Best effort: failures are logged.
func (s *scene) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	del := func(err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	zero := int64(0)
	del(s.client.CoreV1().Namespaces().Delete(ctx, s.ns, metav1.DeleteOptions{GracePeriodSeconds: &zero}))
	pvs, err := s.client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	del(err)
	if err == nil {
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == s.ns {
				del(s.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{}))
			}
		}
	}
	vas, err := s.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	del(err)
	if err == nil {
		for _, va := range vas.Items {
			if strings.HasPrefix(va.Spec.NodeName, s.ns) {
				del(s.client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{}))
			}
		}
	}
	del(s.client.CoreV1().Nodes().Delete(ctx, s.node, metav1.DeleteOptions{}))
	del(s.client.StorageV1().CSIDrivers().Delete(ctx, s.driver, metav1.DeleteOptions{}))
	if err := errors.Join(errs...); err != nil {
		s.t.Logf("cleanup (best effort): %v", err)
	}
}

// volume is a CSI volume of the scene's driver, claimed by a PVC of the
// same name, used by a pod of the same name on the scene's node.
type volume struct {
	name       string // pod, claim
	handle     string
	node       string
	unique     string // as node.status.volumesAttached names it
	attachment string // VolumeAttachment name
}

func (s *scene) volume(name, handle string) volume {
	return volume{
		name:       name,
		handle:     handle,
		node:       s.node,
		unique:     framework.CSIVolumeName(s.driver, handle),
		attachment: framework.VolumeAttachmentName(handle, s.driver, s.node),
	}
}

// createPod creates the claim, its volume and the pod using it.
func (s *scene) createPod(v volume) {
	s.t.Helper()
	s.createClaim(v)
	s.startPod(v)
}

// createClaim creates the claim and its volume, bound. A test with
// kube-controller-manager creates them before it starts, so that its initial
// list holds them: it resolves a pod's claim and PV from its informers when
// the pod comes, and a pod that comes ahead of its PV is left until its
// relist of every pod, every 3 minutes (no PV event brings it back).
func (s *scene) createClaim(v volume) {
	s.t.Helper()
	if _, _, err := framework.CreateBoundPVC(s.ctx, s.client, s.ns, v.name, framework.CSISource(s.driver, v.handle)); err != nil {
		s.t.Fatal(err)
	}
}

// startPod creates the pod using v's claim.
func (s *scene) startPod(v volume) {
	s.t.Helper()
	if _, err := framework.CreatePod(s.ctx, s.client, s.ns, v.name, v.node, v.name); err != nil {
		s.t.Fatal(err)
	}
}

func (s *scene) deletePod(v volume) {
	s.t.Helper()
	zero := int64(0)
	if err := s.client.CoreV1().Pods(s.ns).Delete(s.ctx, v.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		s.t.Fatal(err)
	}
}

// attachment returns the volume's VolumeAttachment, nil if there is none.
func (s *scene) attachment(v volume) (*storagev1.VolumeAttachment, error) {
	va, err := s.client.StorageV1().VolumeAttachments().Get(s.ctx, v.attachment, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return va, err
}

func (s *scene) waitAttached(v volume) *storagev1.VolumeAttachment {
	s.t.Helper()
	var va *storagev1.VolumeAttachment
	framework.Eventually(s.t, waitTimeout, func() (bool, error) {
		var err error
		va, err = s.attachment(v)
		return va != nil && va.Status.Attached, err
	}, "VolumeAttachment %s of %s attached", v.attachment, v.name)
	return va
}

func (s *scene) waitDetached(v volume) {
	s.t.Helper()
	framework.Eventually(s.t, waitTimeout, func() (bool, error) {
		va, err := s.attachment(v)
		return va == nil, err
	}, "VolumeAttachment %s of %s deleted", v.attachment, v.name)
}

// reported returns the volumes node.status.volumesAttached lists.
func (s *scene) reported(node string) ([]string, error) {
	n, err := s.client.CoreV1().Nodes().Get(s.ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, av := range n.Status.VolumesAttached {
		out = append(out, string(av.Name))
	}
	slices.Sort(out)
	return out, nil
}

// waitReported waits until node.status.volumesAttached lists v, or no
// longer does.
func (s *scene) waitReported(v volume, want bool) {
	s.t.Helper()
	framework.Eventually(s.t, waitTimeout, func() (bool, error) {
		got, err := s.reported(v.node)
		return slices.Contains(got, v.unique) == want, err
	}, "node %s status.volumesAttached listing %s: %v", v.node, v.unique, want)
}

// setInUse sets node.status.volumesInUse, as kubelet reports mounts.
func (s *scene) setInUse(node string, vols ...volume) {
	s.t.Helper()
	var names []string
	for _, v := range vols {
		names = append(names, v.unique)
	}
	if err := framework.SetVolumesInUse(s.ctx, s.client, node, names...); err != nil {
		s.t.Fatal(err)
	}
}

// events returns the reasons of the events posted on a pod.
func (s *scene) events(pod string) ([]string, error) {
	list, err := s.client.CoreV1().Events(s.ns).List(s.ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String(),
	})
	if err != nil {
		return nil, err
	}
	var reasons []string
	for _, e := range list.Items {
		reasons = append(reasons, e.Reason)
	}
	return reasons, nil
}
