package controller

import (
	"context"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/migration"
)

// DefaultCSINodeInfoCheckPeriod is how often discovery is asked whether the
// CSINodeInfo CRD is served, when Config does not say. A watch of the CRD
// object asks at once when it changes; the period only covers a watch that
// cannot tell (its events lost, or no permission to watch CRDs).
const DefaultCSINodeInfoCheckPeriod = 10 * time.Minute

// crdRecheck are the delays, after a change of the CRD object, of the checks
// that follow it: discovery serves a new CRD version a moment after the CRD
// says it is established.
var crdRecheck = []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}

// crdGVR names CustomResourceDefinitions; csiNodeInfoCRD is the one of
// CSINodeInfo.
var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

const csiNodeInfoCRD = "csinodeinfos.csi.storage.k8s.io"

// nodeInfos follows the CSINodeInfo CRD while the controller runs: when the
// CRD becomes served it starts an informer for its objects and, once synced,
// hands its lister to the NodeView; when the CRD goes it takes the lister
// back and stops the informer. Each change re-queues every pod: the
// decisions of the in-tree volumes on nodes with a CSINodeInfo (or, for the
// waiting ones, the reason they give) change with it. Handing the lister
// over only once synced means no pod is decided on a half-filled cache.
//
// Only its run goroutine touches its fields.
type nodeInfos struct {
	discovery discovery.DiscoveryInterface
	dynamic   dynamic.Interface
	view      *migration.NodeView
	period    time.Duration
	// handler queues the pods of a node whose CSINodeInfo changed.
	handler toolscache.ResourceEventHandler
	// changed re-queues every pod.
	changed func()

	informer toolscache.SharedIndexInformer
	stop     context.CancelFunc
	done     chan struct{}
	active   bool
}

// start looks once, before the state is rebuilt: when the CRD is served,
// it waits (at most timeout) for the informer to sync, so that the first
// decisions already read CSINodeInfo objects.
func (n *nodeInfos) start(ctx context.Context, timeout time.Duration) {
	n.check(ctx, timeout)
}

// run checks whenever the CRD object changes (and a few times after, see
// crdRecheck), and every period, until ctx is cancelled. The caller stops
// the CSINodeInfo informer (stopInformer) after run has returned.
func (n *nodeInfos) run(ctx context.Context) {
	changed := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	crds := dynamicinformer.NewFilteredDynamicInformer(n.dynamic, crdGVR, "", 0, toolscache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", csiNodeInfoCRD).String()
		}).Informer()
	if _, err := crds.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { notify(o) },
		UpdateFunc: func(_, o any) { notify(o) },
		DeleteFunc: notify,
	}); err != nil {
		klog.FromContext(ctx).Error(err, "Watch the CSINodeInfo CRD; checking it every period only", "period", n.period)
	} else {
		crdCtx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() { crds.RunWithContext(crdCtx) })
		defer func() {
			stop()
			wg.Wait()
		}()
	}
	ticker := time.NewTicker(n.period)
	defer ticker.Stop()
	recheck := time.NewTimer(0)
	<-recheck.C
	defer recheck.Stop()
	next := len(crdRecheck)
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			n.check(ctx, n.period)
		case <-changed:
			next = 0
			recheck.Reset(crdRecheck[0])
		case <-recheck.C:
			n.check(ctx, 10*time.Second)
			if next++; next < len(crdRecheck) {
				recheck.Reset(crdRecheck[next] - crdRecheck[next-1])
			}
		}
	}
}

// check asks discovery once and follows what it says. A new informer is
// waited for at most syncTimeout; if it takes longer, a later check hands
// it over.
func (n *nodeInfos) check(ctx context.Context, syncTimeout time.Duration) {
	logger := klog.FromContext(ctx)
	served, err := migration.CSINodeInfoServed(n.discovery)
	if err != nil {
		// Unknown: keep what is, ask again next period.
		logger.V(2).Info("Could not tell whether the CSINodeInfo CRD is served", "err", err)
		return
	}
	switch {
	case served && n.informer == nil:
		logger.Info("CSINodeInfo CRD served: watching CSINodeInfo objects")
		n.startInformer(ctx)
		if n.informer != nil {
			waitCtx, cancel := context.WithTimeout(ctx, syncTimeout)
			synced := toolscache.WaitForCacheSync(waitCtx.Done(), n.informer.HasSynced)
			cancel()
			if !synced {
				logger.Info("CSINodeInfo informer not synced yet; CSINodeInfo objects are read once it is", "waited", syncTimeout)
			}
		}
	case !served && n.informer != nil:
		logger.Info("CSINodeInfo CRD no longer served: CSINodeInfo objects are not read any more")
		wasActive := n.active
		n.view.SetCSINodeInfos(nil)
		n.active = false
		n.stopInformer()
		if wasActive {
			n.changed()
		}
		return
	}
	if n.informer != nil && !n.active && n.informer.HasSynced() {
		n.view.SetCSINodeInfos(toolscache.NewGenericLister(n.informer.GetIndexer(), migration.CSINodeInfoGVR.GroupResource()))
		n.active = true
		logger.Info("CSINodeInfo objects read: re-deciding every pod's volumes")
		n.changed()
	}
}

func (n *nodeInfos) startInformer(ctx context.Context) {
	informer := dynamicinformer.NewFilteredDynamicInformer(n.dynamic, migration.CSINodeInfoGVR, "", 0, toolscache.Indexers{}, nil).Informer()
	if _, err := informer.AddEventHandler(n.handler); err != nil {
		klog.FromContext(ctx).Error(err, "Watch CSINodeInfo objects")
		return
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		informer.RunWithContext(runCtx)
	}()
	n.informer, n.stop, n.done = informer, cancel, done
}

func (n *nodeInfos) stopInformer() {
	if n.informer == nil {
		return
	}
	n.stop()
	<-n.done
	n.informer, n.stop, n.done = nil, nil, nil
}
