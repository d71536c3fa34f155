// Package controller watches the API and turns objects into facts in the
// caches: "pod P on node N wants volume V (spec S)", "node N is managed, Ready
// and has {..} mounted", "VolumeAttachment A is attached". Event handlers only
// enqueue keys; one idempotent sync per key does the work. Every cache change
// re-queues the volume keys it touched for the reconciler, and the nodes whose
// status report may change for the node status writer.
package controller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/mechanism"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/migration"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/shadow"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Config is what the controller needs from its caller.
type Config struct {
	Client kubernetes.Interface
	// Dynamic reads CSINodeInfo objects; nil disables CSINodeInfo support.
	// Whether their CRD is served is asked of discovery at start and every
	// CSINodeInfoCheckPeriod (zero: DefaultCSINodeInfoCheckPeriod) while
	// running, so that a CRD installed or removed later is followed.
	Dynamic                dynamic.Interface
	CSINodeInfoCheckPeriod time.Duration
	Recorder               record.EventRecorder
	Metrics                *metrics.Metrics
	// Registerer receives the workqueue metrics and the state collector.
	Registerer prometheus.Registerer
	Reconciler reconciler.Config
	// CompletedMigrations are the in-tree plugins attached through their
	// CSI driver on every node, without reading CSINode or CSINodeInfo.
	CompletedMigrations []string
	// InTree holds the in-tree attacher plugins compiled in.
	InTree *intree.Registry
	// Workers is the number of volume workers.
	Workers int
	// StatusWorkers is the number of node status writers. Each write carries
	// every change pending for its node, so few writers suffice; fewer
	// writers batch more per write and leave more of the API budget to
	// attaches and detaches.
	StatusWorkers int
	// StatusHold is how long a node status write that only adds volumes
	// may wait for the other attaches under way on its node, so that one
	// write reports them together; zero: writes go at once.
	StatusHold time.Duration
	// SyncPeriod is the period of the sync that compares attached volumes
	// with their VolumeAttachments; zero disables it.
	SyncPeriod time.Duration
	// HandoffTimeout bounds the handoff of a graceful stop (RunGraceful,
	// handoff.go); zero: stop without one.
	HandoffTimeout time.Duration
	// RateLimiter returns the per-key retry policy of a queue.
	RateLimiter func() workqueue.TypedRateLimiter[cache.Key]
	// NodeRateLimiter is the retry policy of the string-keyed queues.
	NodeRateLimiter func() workqueue.TypedRateLimiter[string]

	// Informers, when set, are the informers the controller reads, with
	// their event delivery in the caller's hands (a driver that schedules
	// events and work itself: the simulation, table tests); nil: shared
	// informers over Client (and Dynamic), started by Run.
	Informers *Informers
	// Clock tells the time; nil: the real clock.
	Clock clock.PassiveClock
	// NewQueue and NewKeyQueue, when set, make the named work queues in
	// place of client-go's rate-limited workqueues (RateLimiter and
	// NodeRateLimiter are then unused).
	NewQueue    func(name string) workqueue.TypedRateLimitingInterface[string]
	NewKeyQueue func(name string) workqueue.TypedRateLimitingInterface[cache.Key]
	// Observer, when set, sees every Node and VolumeAttachment the shared
	// informers read, managedFields included (the caches drop them), and
	// their deletions.
	Observer Observer
	// AnotherController, when set, says whether another attach/detach
	// controller acts beside this one (pkg/guard), and what to do: empty
	// when none. Every /explain answer carries it.
	AnotherController func() string
	// Shadow, when set, runs the controller in shadow mode (pkg/shadow):
	// beside another attach/detach controller, it compares its decisions
	// with what the cluster shows and acts on nothing. Client must then
	// refuse writes (shadow.ReadOnly) and Recorder post nothing.
	Shadow *shadow.Tracker
}

// Observer sees the Nodes and VolumeAttachments the informers read.
type Observer interface {
	// Observe is called with each object as read, before it is trimmed.
	Observe(obj any)
	// Forget is called with each deleted object (or its tombstone).
	Forget(obj any)
}

// Informers are the informers the controller reads. Their caches must hold
// objects passed through Trim.
type Informers struct {
	Pods, PVCs, PVs, Nodes, CSINodes, CSIDrivers, VolumeAttachments toolscache.SharedIndexInformer
	// CSINodeInfos is nil when the CSINodeInfo CRD is not served.
	CSINodeInfos toolscache.SharedIndexInformer

	start    func(stop <-chan struct{})
	shutdown func()
}

// NewInformers returns shared informers over client (and dynamic, for
// CSINodeInfo when csiNodeInfo is true), trimming what they cache.
func NewInformers(client kubernetes.Interface, dyn dynamic.Interface, csiNodeInfo bool, observer Observer) *Informers {
	transform := Trim
	if observer != nil {
		transform = func(obj any) (any, error) {
			switch obj.(type) {
			case *v1.Node, *storagev1.VolumeAttachment:
				observer.Observe(obj)
			}
			return Trim(obj)
		}
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(transform))
	inf := &Informers{
		Pods:              f.Core().V1().Pods().Informer(),
		PVCs:              f.Core().V1().PersistentVolumeClaims().Informer(),
		PVs:               f.Core().V1().PersistentVolumes().Informer(),
		Nodes:             f.Core().V1().Nodes().Informer(),
		CSINodes:          f.Storage().V1().CSINodes().Informer(),
		CSIDrivers:        f.Storage().V1().CSIDrivers().Informer(),
		VolumeAttachments: f.Storage().V1().VolumeAttachments().Informer(),
		start:             f.Start,
		shutdown:          f.Shutdown,
	}
	if csiNodeInfo && dyn != nil {
		df := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
		inf.CSINodeInfos = df.ForResource(migration.CSINodeInfoGVR).Informer()
		inf.start = func(stop <-chan struct{}) { f.Start(stop); df.Start(stop) }
		inf.shutdown = func() { f.Shutdown(); df.Shutdown() }
	}
	return inf
}

func (i *Informers) all() []toolscache.SharedIndexInformer {
	all := []toolscache.SharedIndexInformer{i.Pods, i.PVCs, i.PVs, i.Nodes, i.CSINodes, i.CSIDrivers, i.VolumeAttachments}
	if i.CSINodeInfos != nil {
		all = append(all, i.CSINodeInfos)
	}
	return all
}

// Controller owns the informers, the queues and the workers.
type Controller struct {
	cfg       Config
	client    kubernetes.Interface
	informers *Informers
	clock     clock.PassiveClock

	pods        corelisters.PodLister
	podIndex    toolscache.Indexer
	pvcs        corelisters.PersistentVolumeClaimLister
	pvs         corelisters.PersistentVolumeLister
	nodes       corelisters.NodeLister
	csiDrivers  storagelisters.CSIDriverLister
	attachments storagelisters.VolumeAttachmentLister
	// claimPods, claimPVs and pvAttachments index pods and PVs by the claims
	// they name ("namespace/name") and VolumeAttachments by their PV: kept
	// by the informer handlers (refIndex).
	claimPods     *refIndex
	claimPVs      *refIndex
	pvAttachments *refIndex
	// synced are the informers' and their handlers' (the indexes above are
	// complete once the handlers have seen the initial list); podsSynced,
	// those of pods and claims, read only once the actual state is rebuilt.
	synced, podsSynced []toolscache.InformerSynced

	desired *cache.DesiredState
	actual  *cache.ActualState
	// status is what node status lists and the writes of it under way.
	status     *nodestatus.Record
	nodeView   *migration.NodeView
	reconciler *reconciler.Reconciler
	writer     *nodestatus.Writer
	csi        *mechanism.CSI

	podQueue        workqueue.TypedRateLimitingInterface[string]
	nodeQueue       workqueue.TypedRateLimitingInterface[string]
	attachmentQueue workqueue.TypedRateLimitingInterface[string]
	volumeQueue     workqueue.TypedRateLimitingInterface[cache.Key]
	statusQueue     workqueue.TypedRateLimitingInterface[string]

	// syncVolumeKey and syncNodeStatus sync the volume and node status
	// queues: the reconciler and the node status writer, or in shadow mode
	// the comparison and the reading of node.status (shadow.go); with
	// statusDiffers, chosen once, in New.
	syncVolumeKey  func(context.Context, cache.Key) error
	syncNodeStatus func(context.Context, string) error
	// statusDiffers is called when a Node's status.volumesAttached differs
	// from what the actual state says is reported.
	statusDiffers func(ctx context.Context, node *v1.Node)

	// problems remembers the last warning posted per pod volume, so a pod
	// re-synced many times is told once.
	mu       sync.Mutex
	problems map[string]map[string]string
	// nodeInfos follows the CSINodeInfo CRD; nil when the informers are
	// the caller's (Config.Informers) or Dynamic is nil.
	nodeInfos *nodeInfos
	// goneNodes holds the last state of deleted Node objects until their
	// sync: what they had mounted then, which the lister no longer knows.
	goneNodes map[string]*v1.Node
	// zoneMu orders the zones' looks with the gauge they set (checkZones).
	zoneMu sync.Mutex
	// observing counts the items being processed of the queues that carry
	// the world into the actual state and node status (nodes,
	// VolumeAttachments, node status): a handoff is done only when they
	// are all processed.
	observing atomic.Int64
	// rebuilding: the actual state is being rebuilt (BeginRecovery). Every
	// pod is read afterwards and every key then gets its look
	// (Recovery.Finish), so a node's facts needn't wait for its pods
	// (setNode), nor touch the volume keys. Only set and cleared before the
	// workers start.
	rebuilding bool
}

// New wires a Controller. Nothing runs until Run.
func New(cfg Config) (*Controller, error) {
	if cfg.Workers < 1 || cfg.StatusWorkers < 1 {
		return nil, fmt.Errorf("workers and status workers must be at least 1, got %d and %d", cfg.Workers, cfg.StatusWorkers)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Reconciler.Clock == nil {
		cfg.Reconciler.Clock = cfg.Clock
	}
	actual := cache.NewActualState()
	c := &Controller{
		cfg:       cfg,
		client:    cfg.Client,
		informers: cfg.Informers,
		clock:     cfg.Clock,
		desired:   cache.NewDesiredState(),
		actual:    actual,
		status:    nodestatus.NewRecord(actual),
		problems:  map[string]map[string]string{},
		goneNodes: map[string]*v1.Node{},

		claimPods:     newRefIndex(),
		claimPVs:      newRefIndex(),
		pvAttachments: newRefIndex(),
	}
	if c.informers == nil {
		c.informers = NewInformers(cfg.Client, cfg.Dynamic, false, cfg.Observer)
	}
	inf := c.informers
	if err := inf.Pods.AddIndexers(toolscache.Indexers{indexByNode: podNodeIndex}); err != nil {
		return nil, fmt.Errorf("add pod indexer: %w", err)
	}
	c.podIndex = inf.Pods.GetIndexer()
	c.pods = corelisters.NewPodLister(c.podIndex)
	c.pvcs = corelisters.NewPersistentVolumeClaimLister(inf.PVCs.GetIndexer())
	c.pvs = corelisters.NewPersistentVolumeLister(inf.PVs.GetIndexer())
	c.nodes = corelisters.NewNodeLister(inf.Nodes.GetIndexer())
	c.csiDrivers = storagelisters.NewCSIDriverLister(inf.CSIDrivers.GetIndexer())
	c.attachments = storagelisters.NewVolumeAttachmentLister(inf.VolumeAttachments.GetIndexer())

	var csiNodeInfos toolscache.GenericLister
	if inf.CSINodeInfos != nil {
		csiNodeInfos = toolscache.NewGenericLister(inf.CSINodeInfos.GetIndexer(), migration.CSINodeInfoGVR.GroupResource())
		if _, err := inf.CSINodeInfos.AddEventHandler(c.nodeInfoHandler()); err != nil {
			return nil, fmt.Errorf("watch CSINodeInfo: %w", err)
		}
	}
	c.nodeView = migration.NewNodeView(storagelisters.NewCSINodeLister(inf.CSINodes.GetIndexer()), csiNodeInfos,
		migration.WithCompletedMigrations(cfg.CompletedMigrations...))
	if cfg.Informers == nil && cfg.Dynamic != nil {
		period := cfg.CSINodeInfoCheckPeriod
		if period <= 0 {
			period = DefaultCSINodeInfoCheckPeriod
		}
		c.nodeInfos = &nodeInfos{discovery: cfg.Client.Discovery(), dynamic: cfg.Dynamic, view: c.nodeView, period: period,
			handler: c.nodeInfoHandler(), changed: c.enqueueAllPods}
	}

	if err := c.newQueues(); err != nil {
		return nil, err
	}

	c.csi = mechanism.NewCSI(cfg.Client, c.attachments, c.pvAttachments.get)
	c.reconciler = reconciler.New(c.desired, c.actual, c.status, map[volume.Kind]reconciler.Mechanism{
		volume.KindCSI:    c.csi,
		volume.KindInTree: mechanism.NewInTree(cfg.InTree),
	}, cfg.Recorder, cfg.Metrics, cfg.Reconciler)
	c.writer = nodestatus.NewWriter(cfg.Client, c.status, c.nodeWritten)
	c.writer.Hold, c.writer.Clock = cfg.StatusHold, cfg.Clock
	c.syncVolumeKey, c.syncNodeStatus, c.statusDiffers = c.syncVolume, c.syncStatus, c.rewriteStatus
	if cfg.Shadow != nil {
		c.syncVolumeKey, c.syncNodeStatus, c.statusDiffers = c.syncShadow, c.mirrorStatus, c.queueMirror
	}

	if err := c.addHandlers(); err != nil {
		return nil, err
	}
	for _, i := range inf.all() {
		c.addSynced(i, i.HasSynced)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(metrics.NewStateCollector(metrics.State{
			Desired: c.desired.Stats,
			Actual:  c.actual.Stats,
			Attachments: func() (map[string]int, time.Time) {
				byState, oldest := c.actual.StateStats()
				out := make(map[string]int, len(byState))
				for st, n := range byState {
					out[string(st)] = n
				}
				return out, oldest
			},
		})); err != nil {
			return nil, fmt.Errorf("register state metrics: %w", err)
		}
	}
	return c, nil
}

// Queue names, as the workqueue metrics label them.
const (
	QueuePods              = "pods"
	QueueNodes             = "nodes"
	QueueVolumeAttachments = "volumeattachments"
	QueueVolumes           = "volumes"
	QueueNodeStatus        = "nodestatus"
)

func (c *Controller) newQueues() error {
	cfg := c.cfg
	if cfg.NewQueue == nil || cfg.NewKeyQueue == nil {
		queueMetrics, err := metrics.NewWorkqueueProvider(cfg.Registerer)
		if err != nil {
			return fmt.Errorf("register workqueue metrics: %w", err)
		}
		cfg.NewQueue = func(name string) workqueue.TypedRateLimitingInterface[string] {
			return workqueue.NewTypedRateLimitingQueueWithConfig(cfg.NodeRateLimiter(),
				workqueue.TypedRateLimitingQueueConfig[string]{Name: name, MetricsProvider: queueMetrics})
		}
		cfg.NewKeyQueue = func(name string) workqueue.TypedRateLimitingInterface[cache.Key] {
			// By rank (priority.go, Reconciler.Rank): first a move's
			// steps, then new attaches, then the rest.
			return prioritized(name, queueMetrics, cfg.RateLimiter(), func(k cache.Key) int { return c.reconciler.Rank(k) })
		}
		newQueue := cfg.NewQueue
		cfg.NewQueue = func(name string) workqueue.TypedRateLimitingInterface[string] {
			if name == QueueNodeStatus {
				// A move's writes first, then those that add volumes:
				// pods wait for them (Reconciler.NodeRank).
				return prioritized(name, queueMetrics, cfg.NodeRateLimiter(), func(node string) int { return c.reconciler.NodeRank(node) })
			}
			return newQueue(name)
		}
	}
	c.podQueue = cfg.NewQueue(QueuePods)
	c.nodeQueue = cfg.NewQueue(QueueNodes)
	c.attachmentQueue = cfg.NewQueue(QueueVolumeAttachments)
	c.statusQueue = cfg.NewQueue(QueueNodeStatus)
	c.volumeQueue = cfg.NewKeyQueue(QueueVolumes)
	return nil
}

// Run starts the informers, rebuilds the state, and runs the workers until
// ctx is cancelled; onReady is called once the state is rebuilt. It returns
// once every worker has stopped.
func (c *Controller) Run(ctx context.Context, onReady func()) error {
	return c.RunGraceful(ctx, nil, onReady)
}

// RunGraceful is Run with a graceful stop: once stop (when not nil) is done,
// the controller hands its volumes over (handoff.go) for at most
// Config.HandoffTimeout, then returns. ctx still stops it at once: it is
// cancelled when the controller may no longer act (its Lease is lost).
func (c *Controller) RunGraceful(ctx, stop context.Context, onReady func()) error {
	logger := klog.FromContext(ctx)
	var stopped <-chan struct{}
	if stop != nil {
		stopped = stop.Done()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer c.shutdownQueues()
	// Before the workers start, a graceful stop has nothing to hand over.
	early, cancelEarly := context.WithCancel(ctx)
	defer cancelEarly()
	if stop != nil {
		defer context.AfterFunc(stop, cancelEarly)()
	}
	if c.informers.start != nil {
		c.informers.start(ctx.Done())
		defer func() {
			cancel()
			c.informers.shutdown()
		}()
	}
	logger.Info("Waiting for informer caches")
	listStart := time.Now()
	// The actual state is rebuilt as soon as its informers have listed,
	// while the pods and claims, the longest lists, may still be coming.
	if !toolscache.WaitForCacheSync(early.Done(), c.synced...) {
		if ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("informer caches did not sync: %w", ctx.Err())
	}
	if c.nodeInfos != nil {
		c.nodeInfos.start(ctx, time.Minute)
		defer c.nodeInfos.stopInformer()
	}
	recovery, err := c.BeginRecovery(ctx)
	if err != nil {
		return err
	}
	if !toolscache.WaitForCacheSync(early.Done(), c.podsSynced...) {
		if ctx.Err() == nil {
			return nil
		}
		return fmt.Errorf("informer caches did not sync: %w", ctx.Err())
	}
	// A restart's time to ready is the initial list and the pods' reading,
	// logged apart.
	logger.Info("Informer caches synced", "duration", time.Since(listStart).Round(time.Millisecond))
	var wg sync.WaitGroup
	run := func(n int, worker func(context.Context)) {
		for range n {
			wg.Go(func() { wait.UntilWithContext(ctx, worker, time.Second) })
		}
	}
	startWorkers := func() {
		run(2, c.worker(QueueNodes))
		run(2, c.worker(QueueVolumeAttachments))
		run(c.cfg.Workers, c.worker(QueueVolumes))
		run(c.cfg.StatusWorkers, c.worker(QueueNodeStatus))
	}
	// The pods are read while every other worker runs: a pod created
	// meanwhile is attached without waiting for the rest (Recovery). A
	// shadow, which attaches nothing, reads them all before it compares.
	if c.cfg.Shadow == nil {
		startWorkers()
	}
	stoppedEarly, err := c.readPods(ctx, stopped, recovery)
	if err != nil || ctx.Err() != nil || stoppedEarly {
		if stoppedEarly {
			// Asked to stop while reading the pods: the attaches under way
			// are handed over; nothing was detached, nor will be.
			c.handOver(ctx)
		}
		c.shutdownQueues()
		cancel()
		wg.Wait()
		if err == nil {
			logger.Info("Stopped")
		}
		return err
	}
	recovered := recovery.Finish(ctx)
	if c.cfg.Shadow != nil {
		startWorkers()
	}
	wg.Go(func() {
		start := time.Now()
		tick := time.NewTicker(recoveryFeedInterval)
		defer tick.Stop()
		feedRecovered(ctx, c.volumeQueue, recovered, recoveryFeedDepth, tick.C)
		logger.V(2).Info("Every recovered volume queued", "volumes", len(recovered), "duration", time.Since(start).Round(time.Millisecond))
	})
	run(2, c.worker(QueuePods))
	if c.cfg.SyncPeriod > 0 {
		wg.Go(func() { wait.UntilWithContext(ctx, c.Resync, c.cfg.SyncPeriod) })
	}
	if c.nodeInfos != nil {
		wg.Go(func() { c.nodeInfos.run(ctx) })
	}
	logger.Info("Started", "workers", c.cfg.Workers)
	if onReady != nil {
		onReady()
	}
	select {
	case <-ctx.Done():
	case <-stopped:
		c.handOver(ctx)
	}
	c.shutdownQueues()
	cancel()
	wg.Wait()
	logger.Info("Stopped")
	return nil
}

// addSynced records fn, telling whether informer i (or a handler of it) has
// seen its initial list, among those BeginRecovery waits for or, for pods
// and claims, among those read after.
func (c *Controller) addSynced(i toolscache.SharedIndexInformer, fn toolscache.InformerSynced) {
	if i == c.informers.Pods || i == c.informers.PVCs {
		c.podsSynced = append(c.podsSynced, fn)
		return
	}
	c.synced = append(c.synced, fn)
}

func (c *Controller) shutdownQueues() {
	c.podQueue.ShutDown()
	c.nodeQueue.ShutDown()
	c.attachmentQueue.ShutDown()
	c.volumeQueue.ShutDown()
	c.statusQueue.ShutDown()
}

// touch queues the keys a cache change touched: every key of each volume,
// on every node and under every name, for the reconciler (a detach elsewhere
// may unblock a single-node attach), and each key's node for the status
// writer.
func (c *Controller) touch(keys ...cache.Key) {
	for _, k := range keys {
		c.statusQueue.Add(k.Node)
	}
	if c.rebuilding {
		return
	}
	done := map[volume.Name]bool{}
	for _, k := range keys {
		c.volumeQueue.Add(k)
		if done[k.Volume] {
			continue
		}
		done[k.Volume] = true
		names := []volume.Name{k.Volume}
		for _, dk := range c.desired.KeysFor(k.Volume) {
			c.volumeQueue.Add(dk)
			if spec, _, ok := c.desired.Get(dk); ok {
				names = append(names, spec.AllNames()...)
			}
		}
		for _, name := range names {
			for _, n := range c.actual.NodesOf(name) {
				c.volumeQueue.Add(cache.Key{Volume: name, Node: n})
			}
		}
	}
}
