package migration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2/ktesting"
)

// attacher stands in for the CSI external-attacher of one driver: it sets
// status.attached on that driver's VolumeAttachments. It adds no finalizer,
// so a deleted VolumeAttachment is gone at once (an instant detach).
type attacher struct {
	client kubernetes.Interface
	driver string
	queue  workqueue.TypedRateLimitingInterface[string]
	lister storagelisters.VolumeAttachmentLister
}

// startAttacher runs an attacher for driver until the test ends.
func startAttacher(t *testing.T, client kubernetes.Interface, driver string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(client, 0)
	vas := factory.Storage().V1().VolumeAttachments()
	a := &attacher{
		client: client,
		driver: driver,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](20*time.Millisecond, time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "test-attacher"}),
		lister: vas.Lister(),
	}
	enqueue := func(obj any) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok && va.Spec.Attacher == driver {
			a.queue.Add(va.Name)
		}
	}
	if _, err := vas.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		cancel()
		t.Fatalf("test attacher: add handler: %v", err)
	}
	factory.Start(ctx.Done())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		a.queue.ShutDown()
		wg.Wait()
		factory.Shutdown()
	})
	if !toolscache.WaitForCacheSync(ctx.Done(), vas.Informer().HasSynced) {
		t.Fatalf("test attacher: cache not synced")
	}
	wg.Go(func() { wait.UntilWithContext(ctx, a.worker, time.Second) })
}

func (a *attacher) worker(ctx context.Context) {
	for {
		name, quit := a.queue.Get()
		if quit {
			return
		}
		if err := a.sync(ctx, name); err != nil && ctx.Err() == nil {
			a.queue.AddRateLimited(name)
		} else {
			a.queue.Forget(name)
		}
		a.queue.Done(name)
	}
}

func (a *attacher) sync(ctx context.Context, name string) error {
	va, err := a.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if va.DeletionTimestamp != nil || va.Status.Attached {
		return nil
	}
	va = va.DeepCopy()
	va.Status.Attached = true
	va.Status.AttachError = nil
	_, err = a.client.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("update VolumeAttachment %s status: %w", name, err)
	}
	return nil
}
