package controller_test

// The cost curve: the work the controller does for one event, on clusters of
// 1,000, 10,000 and 100,000 volumes (10 per node), in process: informers
// whose events the benchmark delivers itself and a fake clientset, so that
// what is measured is the controller (handlers, syncs, caches, node status
// batches), not an apiserver. The cost of one event must not grow with the
// cluster; the memory the controller holds per volume is reported by
// BenchmarkControllerMemory.
//
//	go test -run '^$' -bench 'Cost|ControllerMemory' -benchmem ./pkg/controller

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	costDriver       = "csi.example.com"
	volumesPerNode   = 10
	managedNodeLabel = "volumes.kubernetes.io/controller-managed-attach-detach"
)

var costSizes = []int{1_000, 10_000, 100_000}

// syncInformer is a shared informer whose events the benchmark delivers,
// synchronously, through the controller's transform, cache and handlers.
type syncInformer struct {
	toolscache.SharedIndexInformer // only the methods below are used
	indexer                        toolscache.Indexer
	handlers                       []toolscache.ResourceEventHandler
}

func newSyncInformer() *syncInformer {
	return &syncInformer{indexer: toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, toolscache.Indexers{})}
}

func (i *syncInformer) AddEventHandler(h toolscache.ResourceEventHandler) (toolscache.ResourceEventHandlerRegistration, error) {
	i.handlers = append(i.handlers, h)
	return delivered{}, nil
}

// delivered is the registration of a handler the benchmark calls directly: every
// event has reached it by the time it is asked.
type delivered struct {
	toolscache.ResourceEventHandlerRegistration // only HasSynced is used
}

func (delivered) HasSynced() bool                                { return true }
func (i *syncInformer) AddIndexers(ix toolscache.Indexers) error { return i.indexer.AddIndexers(ix) }
func (i *syncInformer) GetIndexer() toolscache.Indexer           { return i.indexer }
func (i *syncInformer) GetStore() toolscache.Store               { return i.indexer }
func (i *syncInformer) HasSynced() bool                          { return true }

func (i *syncInformer) upsert(obj any) {
	obj, err := controller.Trim(obj)
	if err != nil {
		panic(err)
	}
	old, exists, _ := i.indexer.Get(obj)
	if exists {
		_ = i.indexer.Update(obj)
		for _, h := range i.handlers {
			h.OnUpdate(old, obj)
		}
		return
	}
	_ = i.indexer.Add(obj)
	for _, h := range i.handlers {
		h.OnAdd(obj, false)
	}
}

func (i *syncInformer) remove(obj any) {
	obj, err := controller.Trim(obj)
	if err != nil {
		panic(err)
	}
	_ = i.indexer.Delete(obj)
	for _, h := range i.handlers {
		h.OnDelete(obj)
	}
}

// costEnv is one cluster with every volume attached and reported, and a
// controller that has recovered it and is quiet.
type costEnv struct {
	volumes int
	ctx     context.Context
	client  *fake.Clientset
	ctrl    *controller.Controller
	reg     *prometheus.Registry
	inf     costInformers
	queues  queues
	// rv is the cluster's last resourceVersion: the fake API's answers and
	// the benchmarks' own changes draw from it, so a change is always newer
	// than what the controller wrote before it.
	rv int
	// bytesPerVolume is the heap the informer caches and the controller's
	// state hold per volume once recovered; recovery is the time from the
	// informers' initial list (delivered) to quiet: Recover, then every
	// queued sync.
	bytesPerVolume float64
	recovery       time.Duration
}

type costInformers struct{ pods, pvcs, pvs, nodes, csiNodes, csiDrivers, vas *syncInformer }

func nodeName(i int) string { return fmt.Sprintf("node-%05d", i) }
func pvName(i int) string   { return fmt.Sprintf("pv-%06d", i) }
func handle(i int) string   { return fmt.Sprintf("h-%06d", i) }

func uniqueName(i int) v1.UniqueVolumeName {
	return v1.UniqueVolumeName("kubernetes.io/csi/" + costDriver + "^" + handle(i))
}

func costNode(n int, attached bool) *v1.Node {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName(n), ResourceVersion: "1", Annotations: map[string]string{managedNodeLabel: "true"}},
		Status:     v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
	}
	if attached {
		for v := n * volumesPerNode; v < (n+1)*volumesPerNode; v++ {
			node.Status.VolumesAttached = append(node.Status.VolumesAttached, v1.AttachedVolume{Name: uniqueName(v)})
			node.Status.VolumesInUse = append(node.Status.VolumesInUse, uniqueName(v))
		}
	}
	return node
}

// costPV and costPVC are as a CSI provisioner and the PV controller leave
// them: capacity, storage class, labels, annotations, finalizers.
func costPV(i int) *v1.PersistentVolume {
	fs := v1.PersistentVolumeFilesystem
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pvName(i), UID: types.UID("uid-" + pvName(i)),
			Labels:      map[string]string{"topology.kubernetes.io/zone": "zone-a"},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": costDriver, "volume.kubernetes.io/provisioner-deletion-secret-name": ""},
			Finalizers:  []string{"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"}},
		Spec: v1.PersistentVolumeSpec{
			Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: costDriver, VolumeHandle: handle(i),
				FSType: "ext4", VolumeAttributes: map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-8081-" + costDriver}}},
			ClaimRef: &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "ns", Name: "c-" + pvName(i),
				UID: types.UID("uid-c-" + pvName(i)), ResourceVersion: "1234"},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			StorageClassName:              "standard",
			VolumeMode:                    &fs,
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchExpressions: []v1.NodeSelectorRequirement{{Key: "topology.kubernetes.io/zone", Operator: v1.NodeSelectorOpIn, Values: []string{"zone-a"}}}}}}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
}

func costPVC(i int) *v1.PersistentVolumeClaim {
	storageClass := "standard"
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + pvName(i), UID: types.UID("uid-c-" + pvName(i)),
			Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes",
				"volume.beta.kubernetes.io/storage-provisioner": costDriver, "volume.kubernetes.io/storage-provisioner": costDriver},
			Finalizers: []string{"kubernetes.io/pvc-protection"}},
		Spec: v1.PersistentVolumeClaimSpec{VolumeName: pvName(i), AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")}},
			StorageClassName: &storageClass},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")}},
	}
}

func costPod(i, node int, uid string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p-%06d", i), UID: types.UID(uid)},
		Spec: v1.PodSpec{NodeName: nodeName(node), Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c-" + pvName(i)}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
}

func costVA(i, node int, attached bool) *storagev1.VolumeAttachment {
	pv := pvName(i)
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: volume.AttachmentName(handle(i), costDriver, nodeName(node)), UID: types.UID(fmt.Sprintf("va-%06d", i)),
			ResourceVersion: "1"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: costDriver, NodeName: nodeName(node),
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}

var (
	costEnvsMu sync.Mutex
	costEnvs   = map[int]*costEnv{}
)

// envOf builds the cluster of n volumes once per process: the benchmarks of
// one size share it, each leaving it as it found it.
func envOf(b *testing.B, n int) *costEnv {
	b.Helper()
	costEnvsMu.Lock()
	defer costEnvsMu.Unlock()
	if e, ok := costEnvs[n]; ok {
		return e
	}
	b.StopTimer()
	defer b.StartTimer()
	e := &costEnv{volumes: n, ctx: klog.NewContext(context.Background(), klog.Background().V(10)), reg: prometheus.NewRegistry(),
		queues: queues{}}
	nodes := n / volumesPerNode
	// The API answers writes as an apiserver would, without the cost of
	// one: a created VolumeAttachment as sent, a patched Node status as the
	// node with a new resourceVersion.
	e.client = &fake.Clientset{}
	e.rv = 1
	e.client.AddReactor("*", "*", func(action k8stesting.Action) (bool, k8sruntime.Object, error) {
		switch a := action.(type) {
		case k8stesting.CreateAction:
			return true, a.GetObject(), nil
		case k8stesting.DeleteAction:
			return true, nil, nil
		case k8stesting.PatchAction:
			var i int
			if _, err := fmt.Sscanf(a.GetName(), "node-%d", &i); err != nil {
				return true, nil, err
			}
			node := costNode(i, true)
			node.ResourceVersion = e.nextRV()
			return true, node, nil
		}
		return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: action.GetResource().Resource}, "")
	})
	before := heapInUse()

	for _, p := range e.inf.all() {
		*p = newSyncInformer()
	}
	c := e.newController(b, e.reg)
	e.ctrl = c
	attachRequired := true
	e.inf.csiDrivers.upsert(&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: costDriver},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &attachRequired}})
	for i := range nodes {
		e.inf.nodes.upsert(costNode(i, true))
	}
	for i := range n {
		e.inf.pvs.upsert(costPV(i))
		e.inf.pvcs.upsert(costPVC(i))
		e.inf.pods.upsert(costPod(i, i/volumesPerNode, fmt.Sprintf("pod-%06d", i)))
		e.inf.vas.upsert(costVA(i, i/volumesPerNode, true))
	}
	started := time.Now()
	if err := c.Recover(e.ctx); err != nil {
		b.Fatal(err)
	}
	e.drain()
	e.recovery = time.Since(started)
	e.bytesPerVolume = float64(heapInUse()-before) / float64(n)
	if writes := countWrites(e.client); writes != 0 {
		b.Fatalf("recovering a cluster where everything is right made %d writes", writes)
	}
	costEnvs[n] = e
	return e
}

// nextRV is a resourceVersion newer than any the cluster has given so far.
func (e *costEnv) nextRV() string {
	e.rv++
	return fmt.Sprint(e.rv)
}

// all points at each of the informers.
func (i *costInformers) all() []**syncInformer {
	return []**syncInformer{&i.pods, &i.pvcs, &i.pvs, &i.nodes, &i.csiNodes, &i.csiDrivers, &i.vas}
}

// newController makes a controller on e's client, informers and queues,
// registering its metrics into reg.
func (e *costEnv) newController(b *testing.B, reg prometheus.Registerer) *controller.Controller {
	b.Helper()
	c, err := controller.New(controller.Config{
		Client:        e.client,
		Recorder:      &record.FakeRecorder{},
		Metrics:       metrics.New(),
		Registerer:    reg,
		Reconciler:    reconciler.Config{},
		InTree:        intree.NewRegistry(),
		Workers:       1,
		StatusWorkers: 1,
		Informers: &controller.Informers{Pods: e.inf.pods, PVCs: e.inf.pvcs, PVs: e.inf.pvs, Nodes: e.inf.nodes,
			CSINodes: e.inf.csiNodes, CSIDrivers: e.inf.csiDrivers, VolumeAttachments: e.inf.vas},
		NewQueue:    e.queues.newQueue(clock.RealClock{}),
		NewKeyQueue: e.queues.newKeyQueue(clock.RealClock{}),
	})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// drain runs every queued item through its sync, as the workers would,
// until nothing is left.
func (e *costEnv) drain() {
	for e.queues.runQueued(e.ctx, e.ctrl) {
	}
}

// queues are the controller's work queues, by name, made by the hooks of
// controller.Config on clk.
type queues map[string]interface{ Len() int }

func (qs queues) newQueue(clk clock.WithTicker) func(string) workqueue.TypedRateLimitingInterface[string] {
	return func(name string) workqueue.TypedRateLimitingInterface[string] {
		q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Clock: clk})
		qs[name] = q
		return q
	}
}

func (qs queues) newKeyQueue(clk clock.WithTicker) func(string) workqueue.TypedRateLimitingInterface[cache.Key] {
	return func(name string) workqueue.TypedRateLimitingInterface[cache.Key] {
		q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[cache.Key](),
			workqueue.TypedRateLimitingQueueConfig[cache.Key]{Clock: clk})
		qs[name] = q
		return q
	}
}

// runQueued runs every item queued now through its sync, as the workers
// would; it reports whether there was any.
func (qs queues) runQueued(ctx context.Context, c *controller.Controller) bool {
	progress := false
	for _, name := range []string{controller.QueuePods, controller.QueueNodes, controller.QueueVolumeAttachments,
		controller.QueueVolumes, controller.QueueNodeStatus} {
		for qs[name].Len() > 0 {
			c.Process(ctx, name)
			progress = true
		}
	}
	return progress
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func countWrites(c *fake.Clientset) int {
	n := 0
	for _, a := range c.Actions() {
		switch a.GetVerb() {
		case "create", "update", "patch", "delete":
			n++
		}
	}
	return n
}

func forSizes(b *testing.B, fn func(b *testing.B, e *costEnv)) {
	sizes := costSizes
	if testing.Short() {
		// make test runs every benchmark once, at the smallest size, so
		// that a benchmark whose own checks fail fails the tests.
		sizes = sizes[:1]
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("volumes=%d", n), func(b *testing.B) {
			e := envOf(b, n)
			e.client.ClearActions()
			b.ResetTimer()
			fn(b, e)
		})
	}
}

// BenchmarkCostPodAddDelete: a pod is created on a node and deleted again,
// with everything the cluster answers: the VolumeAttachment attached, the
// node mounting and unmounting the volume, the VolumeAttachment gone. One
// op is the whole round trip: 2 VolumeAttachment writes, 2 node status
// patches, every sync in between.
func BenchmarkCostPodAddDelete(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		// A spare volume on node 0, beyond the n that are attached.
		i, node := e.volumes, 0
		e.inf.pvs.upsert(costPV(i))
		e.inf.pvcs.upsert(costPVC(i))
		e.drain()
		b.ResetTimer()
		for op := range b.N {
			pod := costPod(i, node, fmt.Sprintf("spare-%d", op))
			e.inf.pods.upsert(pod)
			e.drain()
			va := costVA(i, node, true)
			e.inf.vas.upsert(va)
			e.drain()
			e.inf.pods.remove(pod)
			e.drain()
			e.inf.vas.remove(va)
			e.drain()
		}
		b.StopTimer()
		if got := countWrites(e.client); got < 4*b.N {
			b.Fatalf("%d writes for %d pods added and deleted: want at least 4 each (attach, status, status, detach)", got, b.N)
		}
	})
}

// BenchmarkCostNodeStatusChange: another writer changes a node's
// volumesAttached; the controller reads the change and rewrites the status
// with all the node's volumes in one patch.
func BenchmarkCostNodeStatusChange(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		for op := range b.N {
			node := costNode(op%(e.volumes/volumesPerNode), true)
			node.ResourceVersion = e.nextRV()
			node.Status.VolumesAttached = node.Status.VolumesAttached[1:]
			e.inf.nodes.upsert(node)
			e.drain()
			// What the controller's rewrite left (the write's echo).
			node = costNode(op%(e.volumes/volumesPerNode), true)
			node.ResourceVersion = e.nextRV()
			e.inf.nodes.upsert(node)
		}
		b.StopTimer()
		e.drain()
		if got := countWrites(e.client); got < b.N {
			b.Fatalf("%d status writes for %d changed statuses", got, b.N)
		}
	})
}

// BenchmarkCostVolumeAttachmentUpdate: the external-attacher updates an
// attached VolumeAttachment (its metadata, say); nothing changes for the
// controller, which must find that out cheaply.
func BenchmarkCostVolumeAttachmentUpdate(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		for op := range b.N {
			i := op % e.volumes
			va := costVA(i, i/volumesPerNode, true)
			va.ResourceVersion = fmt.Sprint(1000 + op)
			va.Status.AttachmentMetadata = map[string]string{"op": fmt.Sprint(op)}
			e.inf.vas.upsert(va)
			e.drain()
		}
		b.StopTimer()
		if got := countWrites(e.client); got != 0 {
			b.Fatalf("%d writes for updates that change nothing", got)
		}
	})
}

// BenchmarkCostSync: one pod update that changes nothing the controller
// reads is a no-op; one that re-syncs the pod runs the pod sync and the
// volume sync (Decide, nothing to do).
func BenchmarkCostSync(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		for op := range b.N {
			i := op % e.volumes
			// A new UID: the same pod re-created, synced from scratch.
			e.inf.pods.upsert(costPod(i, i/volumesPerNode, fmt.Sprintf("pod-%06d-%d", i, op)))
			e.drain()
		}
		b.StopTimer()
		if got := countWrites(e.client); got != 0 {
			b.Fatalf("%d writes for pods whose volumes are attached", got)
		}
	})
}

// BenchmarkCostScrape: one /metrics scrape of the controller's registry
// (the state collector reads the caches), encoded as Prometheus text.
func BenchmarkCostScrape(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		var buf bytes.Buffer
		for range b.N {
			mfs, err := e.reg.Gather()
			if err != nil {
				b.Fatal(err)
			}
			buf.Reset()
			enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
			for _, mf := range mfs {
				if err := enc.Encode(mf); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(buf.Len()), "bytes/scrape")
	})
}

// BenchmarkControllerMemory reports the heap that the informer caches and
// the controller's state hold per volume (pod, claim, PV, VolumeAttachment
// and a tenth of a node each), once recovered, and the time the recovery
// took (with no write: envOf fails otherwise).
func BenchmarkControllerMemory(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		for range b.N {
			_ = e.ctrl
		}
		b.ReportMetric(e.bytesPerVolume, "heap-bytes/volume")
		b.ReportMetric(e.recovery.Seconds(), "recovery-s")
	})
}

// BenchmarkCostRecover: a restart's rebuild of both states from informers
// that hold the whole cluster (everything attached and reported), by a new
// controller: one op is one Recover, also reported per volume.
func BenchmarkCostRecover(b *testing.B) {
	forSizes(b, func(b *testing.B, e *costEnv) {
		b.StopTimer()
		var total time.Duration
		for range b.N {
			// A new process: new informers holding the same objects, new
			// queues, a new controller.
			r := &costEnv{volumes: e.volumes, ctx: e.ctx, client: e.client, queues: queues{}}
			for i, p := range r.inf.all() {
				*p = newSyncInformer()
				for _, o := range (*e.inf.all()[i]).indexer.List() {
					_ = (*p).indexer.Add(o)
				}
			}
			c := r.newController(b, prometheus.NewRegistry())
			start := time.Now()
			b.StartTimer()
			held, err := c.RecoverHeld(e.ctx)
			b.StopTimer()
			total += time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			if len(held) != e.volumes {
				b.Fatalf("recovered %d volume keys, want %d", len(held), e.volumes)
			}
		}
		if writes := countWrites(e.client); writes != 0 {
			b.Fatalf("a rebuild where everything is right made %d writes", writes)
		}
		b.ReportMetric(float64(total.Nanoseconds())/float64(b.N)/float64(e.volumes), "ns/volume")
	})
}
