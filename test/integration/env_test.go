package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// waitTimeout bounds every wait for the controller to act. Volumes
	// attach within a second or two; the margin is for loaded CI machines.
	waitTimeout = 30 * time.Second
	// quietPeriod is how long a "nothing happens" assertion watches, after
	// a control volume in the same test proved the controller is working.
	quietPeriod = 2 * time.Second
	// stopTimeout bounds the return of a stopped controller's Run.
	stopTimeout = 30 * time.Second
)

// env is one test's corner of the shared cluster: a namespace, and a prefix
// for its cluster-scoped objects (nodes, PVs, CSIDrivers, CSINodes).
type env struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	// kubeconfig is the cluster's, for the controller under test.
	kubeconfig string
	ns         string
	prefix     string

	mu      sync.Mutex
	created []func(context.Context) error // cluster-scoped deletions, for cleanup
}

// newEnv creates the test's namespace. At the end of the test, after its
// controller and attachers have stopped (cleanups run last-in first-out), it
// deletes what the test created, so that later tests' controllers don't see
// it.
func newEnv(t *testing.T, base string) *env {
	t.Helper()
	return newEnvOn(t, base, cluster)
}

// newEnvOn is newEnv on a cluster of the test's own.
func newEnvOn(t *testing.T, base string, c *framework.Cluster) *env {
	t.Helper()
	suffix := make([]byte, 2)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	e := &env{
		t:          t,
		ctx:        t.Context(),
		client:     c.Client,
		kubeconfig: c.Kubeconfig,
		prefix:     base + "-" + hex.EncodeToString(suffix),
	}
	e.ns = e.prefix
	if _, err := framework.CreateNamespace(e.ctx, e.client, e.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanup)
	return e
}

func (e *env) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	now := metav1.DeleteOptions{GracePeriodSeconds: new(int64)}
	errs = append(errs, e.client.CoreV1().Pods(e.ns).DeleteCollection(ctx, now, metav1.ListOptions{}))
	errs = append(errs, e.client.CoreV1().PersistentVolumeClaims(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	vas, err := e.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	errs = append(errs, err)
	if err == nil {
		for _, va := range vas.Items {
			if strings.HasPrefix(va.Spec.NodeName, e.prefix) {
				errs = append(errs, ignoreNotFound(e.client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})))
			}
		}
	}
	e.mu.Lock()
	for _, del := range e.created {
		errs = append(errs, ignoreNotFound(del(ctx)))
	}
	e.mu.Unlock()
	errs = append(errs, ignoreNotFound(e.client.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{})))
	if err := errors.Join(errs...); err != nil {
		e.t.Logf("cleanup (best effort): %v", err)
	}
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func (e *env) remember(del func(context.Context) error) {
	e.mu.Lock()
	e.created = append(e.created, del)
	e.mu.Unlock()
}

// name returns a cluster-scoped name unique to the test.
func (e *env) name(s string) string { return e.prefix + "-" + s }

// createNode creates a Ready node, managed by the controller or not, and
// returns its name.
func (e *env) createNode(short string, managed bool) string {
	e.t.Helper()
	node := framework.Node(e.name(short))
	if !managed {
		delete(node.Annotations, framework.ControllerManagedAnnotation)
	}
	if _, err := framework.CreateNode(e.ctx, e.client, node); err != nil {
		e.t.Fatal(err)
	}
	e.remember(func(ctx context.Context) error {
		return e.client.CoreV1().Nodes().Delete(ctx, node.Name, metav1.DeleteOptions{})
	})
	return node.Name
}

// createCSIDriver creates a CSIDriver; attachRequired nil leaves the default.
func (e *env) createCSIDriver(name string, attachRequired *bool) {
	e.t.Helper()
	if _, err := framework.CreateCSIDriver(e.ctx, e.client, name, attachRequired); err != nil {
		e.t.Fatal(err)
	}
	e.remember(func(ctx context.Context) error {
		return e.client.StorageV1().CSIDrivers().Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// createCSINode registers a node's CSINode, as its kubelet would.
func (e *env) createCSINode(node string, drivers []storagev1.CSINodeDriver, migratedPlugins ...string) {
	e.t.Helper()
	if _, err := framework.CreateCSINode(e.ctx, e.client, node, drivers, migratedPlugins...); err != nil {
		e.t.Fatal(err)
	}
	e.remember(func(ctx context.Context) error {
		return e.client.StorageV1().CSINodes().Delete(ctx, node, metav1.DeleteOptions{})
	})
}

// createClaim creates a claim bound to a new PV with the given source
// (ReadWriteOnce unless modes say otherwise) and returns the PV.
func (e *env) createClaim(claim string, src v1.PersistentVolumeSource, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	e.t.Helper()
	pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, claim, src, modes...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.rememberPV(pv.Name)
	return pv
}

// createCSIClaim is createClaim for a CSI volume.
func (e *env) createCSIClaim(claim, driver, handle string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	e.t.Helper()
	return e.createClaim(claim, framework.CSISource(driver, handle), modes...)
}

func (e *env) rememberPV(name string) {
	e.remember(func(ctx context.Context) error {
		return e.client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// createPod creates a pod on node using claims (pod volumes vol-0, vol-1, ...).
func (e *env) createPod(name, node string, claims ...string) *v1.Pod {
	e.t.Helper()
	pod, err := framework.CreatePod(e.ctx, e.client, e.ns, name, node, claims...)
	if err != nil {
		e.t.Fatal(err)
	}
	return pod
}

// deletePod deletes a pod at once, as if its kubelet had confirmed that its
// containers stopped.
func (e *env) deletePod(name string) {
	e.t.Helper()
	err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil {
		e.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// updateNode applies mutate to the node's spec and metadata.
func (e *env) updateNode(name string, mutate func(*v1.Node)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(node)
		_, err = e.client.CoreV1().Nodes().Update(e.ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("update node %s: %v", name, err)
	}
}

func (e *env) setVolumesInUse(node string, volumes ...string) {
	e.t.Helper()
	if err := framework.SetVolumesInUse(e.ctx, e.client, node, volumes...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) setNodeReady(node string, ready bool) {
	e.t.Helper()
	if err := framework.SetNodeReady(e.ctx, e.client, node, ready); err != nil {
		e.t.Fatal(err)
	}
}

// createPendingClaim creates a claim as given, in phase Pending.
func (e *env) createPendingClaim(pvc *v1.PersistentVolumeClaim) {
	e.t.Helper()
	created, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pvc.UID = created.UID
}

// setClaimBound sets a claim's phase to Bound, whatever its volume.
func (e *env) setClaimBound(name string) {
	e.t.Helper()
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pvc.Status.Phase = v1.ClaimBound
	pvc.Status.AccessModes = pvc.Spec.AccessModes
	pvc.Status.Capacity = pvc.Spec.Resources.Requests
	if _, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).UpdateStatus(e.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// createPV creates a PV and sets it Bound.
func (e *env) createPV(pv *v1.PersistentVolume) {
	e.t.Helper()
	created, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.rememberPV(pv.Name)
	created.Status.Phase = v1.VolumeBound
	if _, err := e.client.CoreV1().PersistentVolumes().UpdateStatus(e.ctx, created, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// createPodObject creates a pod built by the caller.
func (e *env) createPodObject(pod *v1.Pod) {
	e.t.Helper()
	if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create pod %s: %v", pod.Name, err)
	}
}
