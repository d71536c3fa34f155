package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// runLabel marks every object of one controller's run, for the cleanup.
const runLabel = "adcbench.kube-attach.io/run"

// setupWorkers is how many requests the unthrottled setup client has in
// flight: enough to keep a 2-core apiserver busy, not so many that it
// queues them for long.
const setupWorkers = 32

// Workload is the object set of one controller's run: N nodes, M volumes
// per node, each volume a bound ReadWriteOnce CSI PV with its own claim and
// pod. Volume v starts on node v/M; churn moves it along the ring of nodes.
type Workload struct {
	Prefix      string // names every object of the run: "ours", "kcm"
	Namespace   string
	Driver      string
	Nodes       int
	PodsPerNode int

	// node[v] is the node volume v is on now; pod[v] the pod using it.
	node []int
	pod  []string
}

// NewWorkload returns the workload of one run; nothing is created yet.
func NewWorkload(prefix, driver string, nodes, podsPerNode int) *Workload {
	w := &Workload{
		Prefix: prefix, Namespace: "bench-" + prefix, Driver: driver,
		Nodes: nodes, PodsPerNode: podsPerNode,
	}
	n := nodes * podsPerNode
	w.node, w.pod = make([]int, n), make([]string, n)
	for v := range n {
		w.node[v] = v / podsPerNode
		w.pod[v] = fmt.Sprintf("pod-%05d", v)
	}
	return w
}

// Volumes is the number of volumes (and pods).
func (w *Workload) Volumes() int { return len(w.node) }

// NodeName names node i; the canary node is CanaryNode.
func (w *Workload) NodeName(i int) string { return fmt.Sprintf("%s-node-%04d", w.Prefix, i) }

// CanaryNode hosts the pod that proves the controller is up before the clock starts.
func (w *Workload) CanaryNode() string { return w.Prefix + "-canary" }

func (w *Workload) claim(v int) string  { return fmt.Sprintf("claim-%05d", v) }
func (w *Workload) handle(v int) string { return fmt.Sprintf("%s-vol-%05d", w.Prefix, v) }

const canaryClaim, canaryPod = "claim-canary", "pod-canary"

func (w *Workload) canaryHandle() string { return w.Prefix + "-vol-canary" }

// NewVolume names a volume created in the middle of a phase, with its claim
// and a pod using it on the canary node: the measure of what a new pod
// waits for while the controller is busy with something else.
type NewVolume string

const (
	// RestartVolume is created right after the controller restarts.
	RestartVolume NewVolume = "restart"
	// TeardownVolume's pod is created right after every other pod is
	// deleted.
	TeardownVolume NewVolume = "teardown"
)

func (n NewVolume) claim() string { return "claim-" + string(n) }
func (n NewVolume) pod() string   { return "pod-" + string(n) }

func (w *Workload) newHandle(n NewVolume) string { return w.Prefix + "-vol-" + string(n) }

// Setup creates the namespace, the nodes (managed, Ready), and every bound
// PV/PVC pair, the canary's included. No pod is created.
func (w *Workload) Setup(ctx context.Context, client kubernetes.Interface) error {
	if _, err := framework.CreateNamespace(ctx, client, w.Namespace); err != nil {
		return err
	}
	err := parallel(ctx, w.Nodes+1, func(ctx context.Context, i int) error {
		name := w.CanaryNode()
		if i < w.Nodes {
			name = w.NodeName(i)
		}
		_, err := framework.CreateNode(ctx, client, w.benchNode(name, i))
		return err
	})
	if err != nil {
		return err
	}
	return parallel(ctx, w.Volumes()+1, func(ctx context.Context, v int) error {
		claim, handle := canaryClaim, w.canaryHandle()
		if v < w.Volumes() {
			claim, handle = w.claim(v), w.handle(v)
		}
		return w.createBoundVolume(ctx, client, claim, handle)
	})
}

// createBoundVolume creates a claim and its bound PV, labelled for the
// cleanup: four requests (the two objects, then their status).
func (w *Workload) createBoundVolume(ctx context.Context, client kubernetes.Interface, claim, handle string) error {
	pvName := framework.PVName(w.Namespace, claim)
	pvc, err := client.CoreV1().PersistentVolumeClaims(w.Namespace).Create(ctx, framework.PVC(w.Namespace, claim, pvName), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create PVC %s/%s: %w", w.Namespace, claim, err)
	}
	pv := framework.PV(pvName, framework.CSISource(w.Driver, handle), pvc)
	pv.Labels = map[string]string{runLabel: w.Prefix}
	if pv, err = client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create PV %s: %w", pvName, err)
	}
	pv.Status.Phase = v1.VolumeBound
	if pv, err = client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set PV %s bound: %w", pvName, err)
	}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: pv.Spec.AccessModes, Capacity: pv.Spec.Capacity}
	if _, err := client.CoreV1().PersistentVolumeClaims(w.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("set PVC %s/%s bound: %w", w.Namespace, claim, err)
	}
	return nil
}

// CreatePods creates the pods of the given volumes on their current nodes.
func (w *Workload) CreatePods(ctx context.Context, client kubernetes.Interface, volumes []int) error {
	return parallel(ctx, len(volumes), func(ctx context.Context, i int) error {
		v := volumes[i]
		_, err := client.CoreV1().Pods(w.Namespace).Create(ctx, w.benchPod(w.pod[v], w.NodeName(w.node[v]), w.claim(v)), metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s: %w", w.pod[v], err)
		}
		return nil
	})
}

// DeletePods deletes the pods of the given volumes at once (no kubelet
// would confirm a graceful deletion).
func (w *Workload) DeletePods(ctx context.Context, client kubernetes.Interface, volumes []int) error {
	return parallel(ctx, len(volumes), func(ctx context.Context, i int) error {
		return deletePod(ctx, client, w.Namespace, w.pod[volumes[i]])
	})
}

func deletePod(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	err := client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	return nil
}

// Move records that the pods of volumes are replaced by pods on the next
// node (round names the new pods).
func (w *Workload) Move(volumes []int, round int) {
	for _, v := range volumes {
		w.node[v] = (w.node[v] + 1) % w.Nodes
		w.pod[v] = fmt.Sprintf("pod-%05d-r%d", v, round)
	}
}

// All returns every volume index.
func (w *Workload) All() []int {
	all := make([]int, w.Volumes())
	for v := range all {
		all[v] = v
	}
	return all
}

// ChurnSet returns the volumes moved in a churn round: one per node, the
// round-th of the node's original volumes.
func (w *Workload) ChurnSet(round int) []int {
	slot := round % w.PodsPerNode
	set := make([]int, 0, w.Nodes)
	for v := range w.Volumes() {
		if v%w.PodsPerNode == slot {
			set = append(set, v)
		}
	}
	return set
}

// Expect returns what the cluster looks like once the controller has caught
// up with the pods of the given volumes (nil: no pod).
func (w *Workload) Expect(volumes []int) *Expectation {
	e := newExpectation(w.Driver)
	for i := range w.Nodes {
		e.addNode(w.NodeName(i))
	}
	for _, v := range volumes {
		e.addVolume(w.handle(v), w.NodeName(w.node[v]))
	}
	return e
}

// CanaryExpect is Expect for the canary node with (or without) its pod.
func (w *Workload) CanaryExpect(withPod bool) *Expectation {
	return w.canaryExpect(w.canaryHandle(), withPod)
}

// canaryExpect is Expect for the canary node with (or without) the volume
// of handle.
func (w *Workload) canaryExpect(handle string, withVolume bool) *Expectation {
	e := newExpectation(w.Driver)
	e.addNode(w.CanaryNode())
	if withVolume {
		e.addVolume(handle, w.CanaryNode())
	}
	return e
}

// CreateNewVolumeClaim creates the volume n (bound PV and claim); no pod
// uses it yet.
func (w *Workload) CreateNewVolumeClaim(ctx context.Context, client kubernetes.Interface, n NewVolume) error {
	return w.createBoundVolume(ctx, client, n.claim(), w.newHandle(n))
}

// CreateNewVolumePod creates, on the canary node, the pod using the volume n.
func (w *Workload) CreateNewVolumePod(ctx context.Context, client kubernetes.Interface, n NewVolume) error {
	if _, err := client.CoreV1().Pods(w.Namespace).Create(ctx, w.benchPod(n.pod(), w.CanaryNode(), n.claim()), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", n.pod(), err)
	}
	return nil
}

// DeleteNewVolumePod deletes the pod of the volume n.
func (w *Workload) DeleteNewVolumePod(ctx context.Context, client kubernetes.Interface, n NewVolume) error {
	return deletePod(ctx, client, w.Namespace, n.pod())
}

// NewVolumeExpect is Expect for the canary node with (or without) the pod
// of the volume n; the canary's own pod and any other new volume's are gone
// by then.
func (w *Workload) NewVolumeExpect(n NewVolume, withPod bool) *Expectation {
	return w.canaryExpect(w.newHandle(n), withPod)
}

// TeardownExpect is what the teardown ends with: nothing attached to the
// workload's nodes, and the teardown's new volume on the canary node.
func (w *Workload) TeardownExpect() *Expectation {
	e := w.Expect(nil)
	e.addNode(w.CanaryNode())
	e.addVolume(w.newHandle(TeardownVolume), w.CanaryNode())
	return e
}

// NewVolumeObjects names the objects the controller writes for the volume
// n: its VolumeAttachment and its node (the canary's, which nothing else
// uses by then).
func (w *Workload) NewVolumeObjects(n NewVolume) map[string]bool {
	names := map[string]bool{w.CanaryNode(): true}
	for va := range w.NewVolumeExpect(n, true).vas {
		names[va] = true
	}
	return names
}

// CreateCanary creates the canary pod.
func (w *Workload) CreateCanary(ctx context.Context, client kubernetes.Interface) error {
	_, err := client.CoreV1().Pods(w.Namespace).Create(ctx, w.benchPod(canaryPod, w.CanaryNode(), canaryClaim), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create canary pod: %w", err)
	}
	return nil
}

// DeleteCanary deletes the canary pod.
func (w *Workload) DeleteCanary(ctx context.Context, client kubernetes.Interface) error {
	return deletePod(ctx, client, w.Namespace, canaryPod)
}

// Cleanup deletes every object of the run except the (empty) namespace: no
// namespace controller runs to finish a namespace deletion. Pods first, then
// claims and PVs side by side, then nodes. A delete-collection of 100,000
// objects outlasts the apiserver's request timeout (the server stops where
// it got to), so each is repeated until none is left.
func (w *Workload) Cleanup(ctx context.Context, client kubernetes.Interface) error {
	zero := metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}
	all := metav1.ListOptions{}
	sel := metav1.ListOptions{LabelSelector: runLabel + "=" + w.Prefix}
	if err := deleteUntilGone[*v1.PodList](ctx, "pods", client.CoreV1().Pods(w.Namespace), zero, all); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var claimsErr, pvsErr error
	wg.Go(func() {
		claimsErr = deleteUntilGone[*v1.PersistentVolumeClaimList](ctx, "claims",
			client.CoreV1().PersistentVolumeClaims(w.Namespace), metav1.DeleteOptions{}, all)
	})
	wg.Go(func() {
		pvsErr = deleteUntilGone[*v1.PersistentVolumeList](ctx, "PVs", client.CoreV1().PersistentVolumes(), metav1.DeleteOptions{}, sel)
	})
	wg.Wait()
	if err := errors.Join(claimsErr, pvsErr); err != nil {
		return err
	}
	return deleteUntilGone[*v1.NodeList](ctx, "nodes", client.CoreV1().Nodes(), metav1.DeleteOptions{}, sel)
}

// collection is what deleteUntilGone needs of a typed client.
type collection[L runtime.Object] interface {
	DeleteCollection(context.Context, metav1.DeleteOptions, metav1.ListOptions) error
	List(context.Context, metav1.ListOptions) (L, error)
}

// deleteUntilGone deletes what sel selects in c until a list finds none
// left, or ctx ends.
func deleteUntilGone[L runtime.Object](ctx context.Context, what string, c collection[L], opts metav1.DeleteOptions, sel metav1.ListOptions) error {
	one := sel
	one.Limit = 1
	for {
		err := c.DeleteCollection(ctx, opts, sel)
		l, lerr := c.List(ctx, one)
		if lerr == nil && meta.LenList(l) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("delete %s: %w", what, errors.Join(err, lerr, ctx.Err()))
		}
		klog.FromContext(ctx).Info("Deleting again: some are left", "what", what, "err", err, "listErr", lerr)
		if err != nil || lerr != nil {
			_ = pause(ctx, time.Second)
		}
	}
}

// benchNode is a managed, Ready node with the status a real kubelet
// reports (capacity, addresses, images), so that caching whole nodes costs
// what it costs in a real cluster.
func (w *Workload) benchNode(name string, i int) *v1.Node {
	n := framework.Node(name)
	n.Labels = map[string]string{
		runLabel:                           w.Prefix,
		"kubernetes.io/hostname":           name,
		"kubernetes.io/os":                 "linux",
		"kubernetes.io/arch":               "amd64",
		"node.kubernetes.io/instance-type": "m5.2xlarge",
		"topology.kubernetes.io/zone":      fmt.Sprintf("zone-%d", i%3),
	}
	res := v1.ResourceList{
		v1.ResourceCPU:              resource.MustParse("8"),
		v1.ResourceMemory:           resource.MustParse("32Gi"),
		v1.ResourcePods:             resource.MustParse("110"),
		v1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	n.Status.Capacity, n.Status.Allocatable = res, res.DeepCopy()
	n.Status.Addresses = []v1.NodeAddress{
		{Type: v1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", i/65536%256, i/256%256, i%256)},
		{Type: v1.NodeHostName, Address: name},
	}
	n.Status.NodeInfo = v1.NodeSystemInfo{
		MachineID: fmt.Sprintf("%032x", i), SystemUUID: fmt.Sprintf("%032x", i+1), BootID: fmt.Sprintf("%032x", i+2),
		KernelVersion: "6.8.0-1021-aws", OSImage: "Ubuntu 24.04.1 LTS", ContainerRuntimeVersion: "containerd://1.7.24",
		KubeletVersion: "v1.37.2", OperatingSystem: "linux", Architecture: "amd64",
	}
	now := n.Status.Conditions[0].LastHeartbeatTime
	for _, t := range []v1.NodeConditionType{v1.NodeMemoryPressure, v1.NodeDiskPressure, v1.NodePIDPressure} {
		n.Status.Conditions = append(n.Status.Conditions, v1.NodeCondition{
			Type: t, Status: v1.ConditionFalse, Reason: "KubeletHasSufficient" + string(t),
			LastHeartbeatTime: now, LastTransitionTime: now,
		})
	}
	for j := range 10 {
		n.Status.Images = append(n.Status.Images, v1.ContainerImage{
			Names: []string{
				fmt.Sprintf("registry.example.com/team/app-%d@sha256:%064x", j, j),
				fmt.Sprintf("registry.example.com/team/app-%d:v1.%d.0", j, j),
			},
			SizeBytes: int64(50_000_000 + j*1_000_000),
		})
	}
	return n
}

// benchPod is a pod scheduled to node with one claim, and the usual
// container details of a real workload.
func (w *Workload) benchPod(name, node, claim string) *v1.Pod {
	p := framework.Pod(w.Namespace, name, node, v1.Volume{
		Name:         "data",
		VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}},
	})
	p.Labels = map[string]string{"app": "bench", "app.kubernetes.io/instance": w.Prefix, "pod-template-hash": "5d8f7c9b4"}
	c := &p.Spec.Containers[0]
	c.Command = []string{"/bin/server", "--data-dir=/data", "--port=8080"}
	c.Env = []v1.EnvVar{{Name: "POD_NAME", Value: name}, {Name: "LOG_LEVEL", Value: "info"}, {Name: "GOMAXPROCS", Value: "2"}}
	c.Resources = v1.ResourceRequirements{
		Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   v1.ResourceList{v1.ResourceMemory: resource.MustParse("256Mi")},
	}
	c.VolumeMounts = []v1.VolumeMount{{Name: "data", MountPath: "/data"}}
	c.Ports = []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}}
	p.Spec.Tolerations = []v1.Toleration{
		{Key: "node.kubernetes.io/not-ready", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))},
		{Key: "node.kubernetes.io/unreachable", Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))},
	}
	return p
}

// parallel runs fn for 0..n-1 with setupWorkers at once; the first error
// stops the rest.
func parallel(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(setupWorkers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// The first error of fn, or the parent's cancellation.
	return context.Cause(ctx)
}

// deleteAttachments deletes every VolumeAttachment of driver; the attacher
// removes its finalizer.
func deleteAttachments(ctx context.Context, client kubernetes.Interface, driver string) error {
	list, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list VolumeAttachments: %w", err)
	}
	var names []string
	for _, va := range list.Items {
		if va.Spec.Attacher == driver {
			names = append(names, va.Name)
		}
	}
	return parallel(ctx, len(names), func(ctx context.Context, i int) error {
		err := client.StorageV1().VolumeAttachments().Delete(ctx, names[i], metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete VolumeAttachment %s: %w", names[i], err)
		}
		return nil
	})
}
