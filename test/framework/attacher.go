package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// NodeIDAnnotation is the annotation in which the CSI external-attacher
// records the node's CSI node ID on a VolumeAttachment.
const NodeIDAnnotation = "csi.alpha.kubernetes.io/node-id"

// AttacherOptions configure an Attacher. The zero value marks every
// VolumeAttachment attached.
type AttacherOptions struct {
	// Drivers are the spec.attacher values handled; empty: all.
	Drivers []string
	// FailPrefix: volumes whose handle starts with it get status.attachError
	// instead of status.attached. Empty: every volume attaches. The handle
	// of an in-tree PV is that of its translation to CSI.
	FailPrefix string
	// FailMessage is the attachError message; AttachFailureMessage by default.
	FailMessage func(handle string) string
	// Finalizer: as the real external-attacher does, add the finalizer
	// AttacherFinalizer(driver) and the NodeIDAnnotation (the node name)
	// before attaching, and remove the finalizer when the VolumeAttachment
	// is deleted. Without it a deleted VolumeAttachment is gone at once.
	Finalizer bool
	// Workers sync VolumeAttachments in parallel. Default: 1.
	Workers int
	// AttachDelay, when set, is how long each attach takes: status is
	// written that long after the attacher took the VolumeAttachment up,
	// as a driver's ControllerPublishVolume would hold it (the worker waits
	// meanwhile). Asked at each attach, so that a caller can change it
	// while the attacher runs. A detach is never delayed.
	AttachDelay func() time.Duration
}

// AttachFailureMessage is the default attachError message for handle.
func AttachFailureMessage(handle string) string {
	return fmt.Sprintf("rpc error: code = Internal desc = test attacher refuses volume %s", handle)
}

// AttacherFinalizer is the finalizer the external-attacher of driver puts on
// the VolumeAttachments it handles.
func AttacherFinalizer(driver string) string {
	return "external-attacher/" + strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '-'
	}, driver)
}

// Attacher stands in for the CSI external-attacher: there is no CSI driver
// behind it, so an attach (or a detach, with Finalizer) succeeds at once,
// unless FailPrefix says otherwise. Status is written by a merge patch of
// the status subresource.
type Attacher struct {
	opts       AttacherOptions
	client     kubernetes.Interface
	translator csitrans.CSITranslator
}

// NewAttacher returns an Attacher; Run starts it.
func NewAttacher(client kubernetes.Interface, opts AttacherOptions) *Attacher {
	if opts.FailMessage == nil {
		opts.FailMessage = AttachFailureMessage
	}
	opts.Workers = max(opts.Workers, 1)
	return &Attacher{opts: opts, client: client, translator: csitrans.New()}
}

// StartAttacher runs an Attacher until the test ends; an error of its Run
// fails the test then.
func StartAttacher(t testing.TB, client kubernetes.Interface, opts AttacherOptions) {
	t.Helper()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- NewAttacher(client, opts).Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// Run watches VolumeAttachments and writes them until ctx is cancelled, and
// returns once its workers have stopped. It returns an error only if it
// could not start: its cache did not sync before ctx was cancelled.
func (a *Attacher) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactory(a.client, 0)
	defer factory.Shutdown()
	informer := factory.Storage().V1().VolumeAttachments()
	lister := informer.Lister()
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[string](20*time.Millisecond, time.Second),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "test-attacher"})
	defer queue.ShutDown()
	enqueue := func(obj any) {
		if va, ok := obj.(*storagev1.VolumeAttachment); ok && a.handles(va.Spec.Attacher) {
			queue.Add(va.Name)
		}
	}
	if _, err := informer.Informer().AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return fmt.Errorf("test attacher: add handler: %w", err)
	}
	factory.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("test attacher: cache not synced")
	}
	var wg sync.WaitGroup
	for range a.opts.Workers {
		wg.Go(func() {
			for {
				name, quit := queue.Get()
				if quit {
					return
				}
				va, err := lister.Get(name)
				switch {
				case apierrors.IsNotFound(err):
					err = nil
				case err == nil:
					err = a.sync(ctx, va)
				}
				if err != nil && ctx.Err() == nil {
					klog.FromContext(ctx).Info("Test attacher: retrying", "volumeAttachment", name, "err", err)
					queue.AddRateLimited(name)
				} else {
					queue.Forget(name)
				}
				queue.Done(name)
			}
		})
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
	return nil
}

func (a *Attacher) handles(driver string) bool {
	return len(a.opts.Drivers) == 0 || slices.Contains(a.opts.Drivers, driver)
}

// sync takes va one step: finalizer first (if configured), then status;
// the informer's update event brings the next step.
func (a *Attacher) sync(ctx context.Context, va *storagev1.VolumeAttachment) error {
	finalizer := AttacherFinalizer(va.Spec.Attacher)
	has := slices.Contains(va.Finalizers, finalizer)
	switch {
	case va.DeletionTimestamp != nil:
		if !has {
			return nil
		}
		rest := slices.DeleteFunc(slices.Clone(va.Finalizers), func(f string) bool { return f == finalizer })
		return a.patch(ctx, va.Name, "", map[string]any{"metadata": map[string]any{
			"finalizers": rest, "resourceVersion": va.ResourceVersion,
		}})
	case a.opts.Finalizer && !has:
		return a.patch(ctx, va.Name, "", map[string]any{"metadata": map[string]any{
			"finalizers":      append(slices.Clone(va.Finalizers), finalizer),
			"annotations":     map[string]string{NodeIDAnnotation: va.Spec.NodeName},
			"resourceVersion": va.ResourceVersion,
		}})
	case va.Status.Attached:
		return nil
	}
	if err := a.attachDelay(ctx); err != nil {
		return err
	}
	status := map[string]any{"attached": true}
	if a.opts.FailPrefix != "" {
		handle, err := a.handle(ctx, va)
		if err != nil {
			return err
		}
		if strings.HasPrefix(handle, a.opts.FailPrefix) {
			msg := a.opts.FailMessage(handle)
			if e := va.Status.AttachError; e != nil && e.Message == msg {
				return nil
			}
			status = map[string]any{
				"attached":    false,
				"attachError": map[string]any{"time": metav1.Now(), "message": msg},
			}
		}
	}
	return a.patch(ctx, va.Name, "status", map[string]any{"status": status})
}

// attachDelay waits for AttachDelay, or until ctx is done.
func (a *Attacher) attachDelay(ctx context.Context) error {
	if a.opts.AttachDelay == nil {
		return nil
	}
	d := a.opts.AttachDelay()
	if d <= 0 {
		return nil
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

// patch merge-patches the VolumeAttachment, or its subresource if not "".
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
		return nil // deleted meanwhile: nothing left to do
	}
	if err != nil {
		return fmt.Errorf("patch VolumeAttachment %s %s: %w", name, subresource, err)
	}
	return nil
}

// handle reads the volume handle of the attachment's source, translating
// an in-tree PV to CSI as the external-attacher does.
func (a *Attacher) handle(ctx context.Context, va *storagev1.VolumeAttachment) (string, error) {
	src := va.Spec.Source
	switch {
	case src.PersistentVolumeName != nil:
		pv, err := a.client.CoreV1().PersistentVolumes().Get(ctx, *src.PersistentVolumeName, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("get PersistentVolume %s: %w", *src.PersistentVolumeName, err)
		}
		if pv.Spec.CSI == nil && a.translator.IsPVMigratable(pv) {
			if pv, err = a.translator.TranslateInTreePVToCSI(klog.FromContext(ctx), pv); err != nil {
				return "", fmt.Errorf("translate PersistentVolume %s to CSI: %w", *src.PersistentVolumeName, err)
			}
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
