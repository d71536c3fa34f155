package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sync"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// attacherWorkers keep the test attacher ahead of the controller. Each
// VolumeAttachment takes two patches in turn: at 50 ms a patch (a busy
// 2-core apiserver with 100,000 volumes), 16 workers marked at most about
// 150 attached a second, less than a controller allowed 200 requests a
// second creates.
const attacherWorkers = 64

const nodeIDAnnotation = "csi.alpha.kubernetes.io/node-id"

// Attacher stands in for the CSI external-attacher of one driver, as the
// controllers see it: it adds its finalizer and the node-id annotation, then
// sets status.attached; on deletion it removes its finalizer (the detach
// succeeds at once). Its client is not throttled.
type Attacher struct {
	driver    string
	finalizer string
	client    kubernetes.Interface
	factory   informers.SharedInformerFactory
	lister    storagelisters.VolumeAttachmentLister
	queue     workqueue.TypedRateLimitingInterface[string]
	wg        sync.WaitGroup
}

// StartAttacher runs an Attacher until ctx is cancelled; Wait waits for it.
func StartAttacher(ctx context.Context, client kubernetes.Interface, driver string) (*Attacher, error) {
	f := informers.NewSharedInformerFactory(client, 0)
	inf := f.Storage().V1().VolumeAttachments()
	a := &Attacher{
		driver:    driver,
		finalizer: "external-attacher/" + regexp.MustCompile(`[^a-zA-Z0-9-]`).ReplaceAllString(driver, "-"),
		client:    client,
		factory:   f,
		lister:    inf.Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](10*time.Millisecond, time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "bench-attacher"}),
	}
	enqueue := func(obj any) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok && va.Spec.Attacher == driver {
			a.queue.Add(va.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, fmt.Errorf("attacher: add handler: %w", err)
	}
	f.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		a.queue.ShutDown()
		f.Shutdown()
		return nil, fmt.Errorf("attacher: cache not synced: %w", ctx.Err())
	}
	for range attacherWorkers {
		a.wg.Go(func() { a.worker(ctx) })
	}
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	return a, nil
}

// Wait returns once the attacher has stopped.
func (a *Attacher) Wait() {
	a.wg.Wait()
	a.factory.Shutdown()
}

func (a *Attacher) worker(ctx context.Context) {
	for {
		name, quit := a.queue.Get()
		if quit {
			return
		}
		if err := a.sync(ctx, name); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).V(2).Info("Attacher: retrying", "volumeAttachment", name, "err", err)
			a.queue.AddRateLimited(name)
		} else {
			a.queue.Forget(name)
		}
		a.queue.Done(name)
	}
}

func (a *Attacher) sync(ctx context.Context, name string) error {
	va, err := a.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	has := slices.Contains(va.Finalizers, a.finalizer)
	switch {
	case va.DeletionTimestamp != nil:
		if !has {
			return nil
		}
		rest := slices.DeleteFunc(slices.Clone(va.Finalizers), func(f string) bool { return f == a.finalizer })
		return a.patch(ctx, name, "", map[string]any{"metadata": map[string]any{
			"finalizers": rest, "resourceVersion": va.ResourceVersion,
		}})
	case !has:
		// The next sync, on the informer's update, marks it attached.
		return a.patch(ctx, name, "", map[string]any{"metadata": map[string]any{
			"finalizers":      append(slices.Clone(va.Finalizers), a.finalizer),
			"annotations":     map[string]string{nodeIDAnnotation: va.Spec.NodeName},
			"resourceVersion": va.ResourceVersion,
		}})
	case !va.Status.Attached:
		return a.patch(ctx, name, "status", map[string]any{"status": map[string]any{"attached": true}})
	}
	return nil
}

func (a *Attacher) patch(ctx context.Context, name, subresource string, body map[string]any) error {
	patch, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode patch: %w", err)
	}
	var sub []string
	if subresource != "" {
		sub = []string{subresource}
	}
	_, err = a.client.StorageV1().VolumeAttachments().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, sub...)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patch VolumeAttachment %s %s: %w", name, subresource, err)
	}
	return nil
}
