package controller

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// Resync compares attached CSI volumes with their VolumeAttachments and
// queues those that disagree. It only enqueues: the workers act.
func (c *Controller) Resync(ctx context.Context) {
	n := 0
	for _, a := range c.actual.AttachmentStates() {
		va, err := c.attachments.Get(a.AttachmentName)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			continue
		case va.Status.Attached == (a.State == cache.Attached) && (va.DeletionTimestamp != nil) == (a.State == cache.Detaching):
			continue
		}
		c.attachmentQueue.Add(a.AttachmentName)
		n++
	}
	klog.FromContext(ctx).V(3).Info("Periodic sync", "mismatched", n)
}
