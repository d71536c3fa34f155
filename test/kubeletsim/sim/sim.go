// Package sim simulates the part of kubelet the attach/detach controller
// talks to, for any number of nodes, with nothing but API calls, in the
// order kubelet v1.37 does it (pkg/kubelet/volumemanager,
// kubelet_node_status.go, pkg/volume/csi/nodeinfomanager):
//
//   - At start it registers the nodes (managed by the attach/detach
//     controller, Ready) and, now, later or never, their CSINodes: created
//     with no driver and the migrated-plugins annotation listing every
//     translatable in-tree plugin, whatever is installed; the drivers
//     register a moment later, each with the node ID it gives (not the
//     node's name).
//   - A volume is in use (node.status.volumesInUse) from the moment a pod
//     that uses it is on the node, attached or not, until it is unmounted:
//     the desired and the actual state of kubelet's volume manager.
//   - node.status.volumesInUse is written by each node's status loop only,
//     every --node-status-update-frequency (10 s), when it changed. A pod's
//     volume is mounted only once that field lists it and a fresh read of
//     node.status.volumesAttached lists it.
//   - A pod being deleted gets phase Succeeded, its volumes are unmounted,
//     and it is deleted: its volume leaves volumesInUse only at the next
//     status update, after the pod is gone. A pod deleted at once keeps its
//     volume in use until it is unmounted.
//   - After a restart, what node status says is mounted (in use and
//     attached, for a pod there) stays mounted and in use; the first status
//     update, before the pods are read again, lists only that.
//
// Volumes are named as kubelet names them (see Namer), so a controller that
// reports a volume under another name never sees it in use, as with a real
// kubelet.
//
// The mounts are one idempotent sync per node, driven by a queue fed by pod,
// node, claim and PersistentVolume events and by the status loop.
package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Index names of the informer caches.
const (
	podsByNode       = "spec.nodeName"
	podsByClaim      = "claim"
	claimsByVolumeID = "spec.volumeName"
)

// Simulator is the simulated kubelet of a set of nodes.
type Simulator struct {
	client    kubernetes.Interface
	opts      Options
	nodeNames []string
	nodeSet   sets.Set[string]

	factory    informers.SharedInformerFactory
	pods       cache.Indexer
	claims     cache.Indexer
	nodeLister corelisters.NodeLister
	namer      *Namer

	queue workqueue.TypedRateLimitingInterface[string]
	// kubelets holds each node's volume manager, by node name.
	kubelets map[string]*kubelet
}

// New builds a Simulator; opts must have passed Validate. Call Run once.
func New(client kubernetes.Interface, opts Options) (*Simulator, error) {
	s := &Simulator{
		client:  client,
		opts:    opts,
		nodeSet: sets.New[string](),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "kubeletsim"},
		),
	}
	s.kubelets = map[string]*kubelet{}
	for i := range opts.Nodes {
		name := NodeName(opts.NodePrefix, i)
		s.nodeNames = append(s.nodeNames, name)
		s.nodeSet.Insert(name)
		s.kubelets[name] = newKubelet()
	}

	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTransform(stripManagedFields))
	podInformer := s.factory.Core().V1().Pods().Informer()
	claimInformer := s.factory.Core().V1().PersistentVolumeClaims().Informer()
	pvInformer := s.factory.Core().V1().PersistentVolumes().Informer()
	nodeInformer := s.factory.Core().V1().Nodes().Informer()

	if err := podInformer.AddIndexers(cache.Indexers{podsByNode: s.indexPodByNode, podsByClaim: indexPodByClaim}); err != nil {
		return nil, fmt.Errorf("add pod indexers: %w", err)
	}
	if err := claimInformer.AddIndexers(cache.Indexers{claimsByVolumeID: indexClaimByVolume}); err != nil {
		return nil, fmt.Errorf("add claim indexers: %w", err)
	}
	s.pods = podInformer.GetIndexer()
	s.claims = claimInformer.GetIndexer()
	s.nodeLister = s.factory.Core().V1().Nodes().Lister()
	s.namer = &Namer{
		PVCs:     s.factory.Core().V1().PersistentVolumeClaims().Lister(),
		PVs:      s.factory.Core().V1().PersistentVolumes().Lister(),
		Migrated: sets.New(opts.MigratedPlugins...),
	}

	handlers := []struct {
		informer cache.SharedIndexInformer
		handler  cache.ResourceEventHandler
		what     string
	}{
		{podInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    s.onPod,
			UpdateFunc: func(_, obj any) { s.onPod(obj) },
			DeleteFunc: s.onPod,
		}, "pod"},
		{nodeInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    s.onNodeAdd,
			UpdateFunc: s.onNodeUpdate,
		}, "node"},
		{claimInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    s.onClaim,
			UpdateFunc: func(_, obj any) { s.onClaim(obj) },
			DeleteFunc: s.onClaim,
		}, "claim"},
		{pvInformer, cache.ResourceEventHandlerFuncs{
			AddFunc:    s.onPV,
			UpdateFunc: func(_, obj any) { s.onPV(obj) },
			DeleteFunc: s.onPV,
		}, "PersistentVolume"},
	}
	for _, h := range handlers {
		if _, err := h.informer.AddEventHandler(h.handler); err != nil {
			return nil, fmt.Errorf("add %s event handler: %w", h.what, err)
		}
	}
	return s, nil
}

// Run registers the nodes, then keeps their volumesInUse up to date until
// ctx is cancelled. It returns nil once everything it started has stopped,
// or the error that stopped it.
func (s *Simulator) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer s.queue.ShutDown()

	uids, err := s.registerNodes(ctx)
	if err != nil {
		return stopCause(ctx, fmt.Errorf("register nodes: %w", err))
	}

	var wg sync.WaitGroup
	// Informers stop with ctx; wait for them and every goroutine of ours.
	defer func() {
		cancel(nil)
		s.queue.ShutDown()
		wg.Wait()
		s.factory.Shutdown()
	}()

	if delay, create := s.opts.csiNodes(); create {
		csiNodes := func() error {
			if err := s.registerCSINodes(ctx, uids); err != nil {
				return fmt.Errorf("register CSINodes: %w", err)
			}
			return nil
		}
		drivers := func() error {
			if err := sleep(ctx, s.opts.DriverRegistrationDelay); err != nil {
				return err
			}
			if err := s.registerDrivers(ctx); err != nil {
				return fmt.Errorf("register CSI drivers: %w", err)
			}
			return nil
		}
		if delay == 0 {
			if err := csiNodes(); err != nil {
				return stopCause(ctx, err)
			}
		} else {
			logger.Info("CSINodes will be created later", "delay", delay)
		}
		wg.Go(func() {
			err := sleep(ctx, delay)
			if err == nil && delay != 0 {
				err = csiNodes()
			}
			if err == nil {
				err = drivers()
			}
			if err != nil && ctx.Err() == nil {
				cancel(err)
			}
		})
	} else {
		logger.Info("CSINodes are not created")
	}

	s.factory.Start(ctx.Done())
	for typ, ok := range s.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return stopCause(ctx, fmt.Errorf("cache of %v did not sync", typ))
		}
	}
	logger.Info("Simulating kubelet", "nodes", len(s.nodeNames), "workers", s.opts.Workers, "statusUpdateFrequency", s.opts.StatusUpdateFrequency)

	s.reconstruct(ctx)
	for range s.opts.Workers {
		wg.Go(func() {
			for s.processNextItem(ctx) {
			}
		})
	}
	for _, name := range s.nodeNames {
		wg.Go(func() { s.statusLoop(ctx, name) })
	}
	<-ctx.Done()
	logger.Info("Shutting down")
	return stopCause(ctx, nil)
}

// sleep waits d, or returns ctx's error once it is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// stopCause is what Run returns: ifRunning while ctx is live; once ctx is
// done, nil when the caller cancelled it (whatever failed because of that),
// or the failure that cancelled it.
func stopCause(ctx context.Context, ifRunning error) error {
	if ctx.Err() == nil {
		return ifRunning
	}
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		return cause
	}
	return nil
}

func (s *Simulator) processNextItem(ctx context.Context) bool {
	node, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(node)
	logger := klog.FromContext(ctx).WithValues("node", node)
	err := s.sync(klog.NewContext(ctx, logger), node)
	if err == nil {
		s.queue.Forget(node)
		return true
	}
	if ctx.Err() == nil {
		logger.Error(err, "Sync failed, will retry")
		s.queue.AddRateLimited(node)
	}
	return true
}

func (s *Simulator) indexPodByNode(obj any) ([]string, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok || !s.nodeSet.Has(pod.Spec.NodeName) {
		return nil, nil
	}
	return []string{pod.Spec.NodeName}, nil
}

func indexPodByClaim(obj any) ([]string, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, vol := range pod.Spec.Volumes {
		switch {
		case vol.PersistentVolumeClaim != nil:
			keys = append(keys, pod.Namespace+"/"+vol.PersistentVolumeClaim.ClaimName)
		case vol.Ephemeral != nil:
			keys = append(keys, pod.Namespace+"/"+pod.Name+"-"+vol.Name)
		}
	}
	return keys, nil
}

func indexClaimByVolume(obj any) ([]string, error) {
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok || pvc.Spec.VolumeName == "" {
		return nil, nil
	}
	return []string{pvc.Spec.VolumeName}, nil
}

// stripManagedFields trims what the caches keep: nothing here reads them.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// unwrap returns the object of an event, also of a delete whose final state
// was missed.
func unwrap(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

func (s *Simulator) onPod(obj any) {
	if pod, ok := unwrap(obj).(*v1.Pod); ok && s.nodeSet.Has(pod.Spec.NodeName) {
		s.queue.Add(pod.Spec.NodeName)
	}
}

func (s *Simulator) onNodeAdd(obj any) {
	if node, ok := obj.(*v1.Node); ok && s.nodeSet.Has(node.Name) {
		s.queue.Add(node.Name)
	}
}

func (s *Simulator) onNodeUpdate(oldObj, newObj any) {
	oldNode, ok1 := oldObj.(*v1.Node)
	node, ok2 := newObj.(*v1.Node)
	if !ok1 || !ok2 || !s.nodeSet.Has(node.Name) {
		return
	}
	// Only what sync reads matters; conditions, heartbeats, labels don't.
	if !attachedEqual(oldNode.Status.VolumesAttached, node.Status.VolumesAttached) ||
		!sameVolumes(oldNode.Status.VolumesInUse, node.Status.VolumesInUse) {
		s.queue.Add(node.Name)
	}
}

func attachedEqual(a, b []v1.AttachedVolume) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// onClaim requeues the nodes of the pods that use a claim.
func (s *Simulator) onClaim(obj any) {
	if pvc, ok := unwrap(obj).(*v1.PersistentVolumeClaim); ok {
		s.enqueueClaimUsers(pvc.Namespace + "/" + pvc.Name)
	}
}

// onPV requeues the nodes of the pods that use a PersistentVolume, through
// its claimRef or the claims that name it.
func (s *Simulator) onPV(obj any) {
	pv, ok := unwrap(obj).(*v1.PersistentVolume)
	if !ok {
		return
	}
	claimKeys := sets.New[string]()
	if ref := pv.Spec.ClaimRef; ref != nil {
		claimKeys.Insert(ref.Namespace + "/" + ref.Name)
	}
	objs, err := s.claims.ByIndex(claimsByVolumeID, pv.Name)
	if err != nil {
		// Only an unknown index name fails; that is a bug, not a state.
		panic(fmt.Errorf("claims index %s: %w", claimsByVolumeID, err))
	}
	for _, obj := range objs {
		pvc := obj.(*v1.PersistentVolumeClaim)
		claimKeys.Insert(pvc.Namespace + "/" + pvc.Name)
	}
	for key := range claimKeys {
		s.enqueueClaimUsers(key)
	}
}

func (s *Simulator) enqueueClaimUsers(claimKey string) {
	objs, err := s.pods.ByIndex(podsByClaim, claimKey)
	if err != nil {
		// As above: only an unknown index name fails.
		panic(fmt.Errorf("pods index %s: %w", podsByClaim, err))
	}
	for _, obj := range objs {
		if pod := obj.(*v1.Pod); s.nodeSet.Has(pod.Spec.NodeName) {
			s.queue.Add(pod.Spec.NodeName)
		}
	}
}
