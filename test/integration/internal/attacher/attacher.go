// Package attacher is a stand-in for the CSI external-attacher in
// integration tests: it marks the VolumeAttachments of one driver attached,
// or failed for volume handles with a given prefix. There is no CSI driver
// behind it and it adds no finalizer, so a VolumeAttachment the controller
// deletes is gone at once, as if the detach had succeeded immediately.
package attacher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Config says which VolumeAttachments the Attacher handles and how.
type Config struct {
	// Driver is the spec.attacher value handled; others are ignored.
	Driver string
	// FailPrefix: volumes whose handle starts with it get status.attachError
	// instead of status.attached. Empty: every volume attaches.
	FailPrefix string
	// FailMessage is the attachError message; FailureMessage(handle) by default.
	FailMessage func(handle string) string
}

// FailureMessage is the default attachError message for handle.
func FailureMessage(handle string) string {
	return fmt.Sprintf("rpc error: code = Internal desc = test attacher refuses volume %s", handle)
}

// Attacher watches VolumeAttachments and writes their status.
type Attacher struct {
	cfg    Config
	client kubernetes.Interface
	queue  workqueue.TypedRateLimitingInterface[string]
	lister storagelisters.VolumeAttachmentLister
}

// Start runs an Attacher until ctx is cancelled. It returns once its cache
// has synced; the returned function waits until it has stopped.
func Start(ctx context.Context, client kubernetes.Interface, cfg Config) (stopped func(), err error) {
	if cfg.Driver == "" {
		return nil, errors.New("test attacher: no driver name")
	}
	if cfg.FailMessage == nil {
		cfg.FailMessage = FailureMessage
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	informer := factory.Storage().V1().VolumeAttachments()
	a := &Attacher{
		cfg:    cfg,
		client: client,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "test-attacher-" + cfg.Driver}),
		lister: informer.Lister(),
	}
	enqueue := func(obj any) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok && va.Spec.Attacher == cfg.Driver {
			a.queue.Add(va.Name)
		}
	}
	if _, err := informer.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return nil, fmt.Errorf("test attacher: add handler: %w", err)
	}
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		a.queue.ShutDown()
		factory.Shutdown()
		return nil, fmt.Errorf("test attacher: cache not synced: %w", ctx.Err())
	}
	var wg sync.WaitGroup
	wg.Go(func() { wait.UntilWithContext(ctx, a.worker, time.Second) })
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	return func() {
		wg.Wait()
		factory.Shutdown()
	}, nil
}

func (a *Attacher) worker(ctx context.Context) {
	for {
		name, quit := a.queue.Get()
		if quit {
			return
		}
		err := a.sync(ctx, name)
		if err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Info("Test attacher: retrying", "volumeAttachment", name, "err", err)
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
	if va.DeletionTimestamp != nil || va.Status.Attached {
		return nil
	}
	handle, err := a.handle(ctx, va)
	if err != nil {
		return err
	}
	status := map[string]any{"attached": true}
	if a.cfg.FailPrefix != "" && strings.HasPrefix(handle, a.cfg.FailPrefix) {
		msg := a.cfg.FailMessage(handle)
		if e := va.Status.AttachError; e != nil && e.Message == msg {
			return nil
		}
		status = map[string]any{
			"attached":    false,
			"attachError": map[string]any{"time": metav1.Now(), "message": msg},
		}
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return fmt.Errorf("encode status patch: %w", err)
	}
	_, err = a.client.StorageV1().VolumeAttachments().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("patch VolumeAttachment %s status: %w", name, err)
	}
	return nil
}

// handle reads the volume handle of the attachment's source.
func (a *Attacher) handle(ctx context.Context, va *storagev1.VolumeAttachment) (string, error) {
	src := va.Spec.Source
	switch {
	case src.PersistentVolumeName != nil:
		pv, err := a.client.CoreV1().PersistentVolumes().Get(ctx, *src.PersistentVolumeName, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("get PersistentVolume %s: %w", *src.PersistentVolumeName, err)
		}
		if pv.Spec.CSI == nil {
			return "", fmt.Errorf("PersistentVolume %s is not a CSI volume", pv.Name)
		}
		return pv.Spec.CSI.VolumeHandle, nil
	case src.InlineVolumeSpec != nil && src.InlineVolumeSpec.CSI != nil:
		return src.InlineVolumeSpec.CSI.VolumeHandle, nil
	}
	return "", fmt.Errorf("VolumeAttachment %s has no CSI source", va.Name)
}
