package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// syncAttachment records what a VolumeAttachment says in the actual state:
// attached, failing, being deleted, or gone (detached).
func (c *Controller) syncAttachment(ctx context.Context, name string) error {
	logger := klog.FromContext(ctx)
	va, err := c.attachments.Get(name)
	if apierrors.IsNotFound(err) {
		c.csi.Dropped(name)
	}
	if err == nil && c.csi.Gone(name, va.UID) {
		// A cached copy of an object the API said is gone.
		err = apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
	}
	if apierrors.IsNotFound(err) {
		if k, ok := c.actual.ByAttachmentName(name); ok {
			// Only an object that was seen is known to be gone: a create of
			// the controller's own not seen yet may follow the delete of an
			// older object of the same name.
			a, _ := c.actual.Get(k)
			if a.AttachmentName != name {
				return nil
			}
			if a.AttachmentUID == "" || a.CreatedUID != "" {
				// Not proof: the object on record was never seen, or the
				// controller created one of that name since it saw it (the
				// object gone may be an older one, shown after the
				// create). The API says.
				_, err := c.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
				switch {
				case err == nil:
					c.volumeQueue.Add(k)
					return nil
				case !apierrors.IsNotFound(err):
					return fmt.Errorf("get VolumeAttachment %s: %w", name, err)
				}
			}
			if !a.DetachStarted.IsZero() && a.State != cache.Detaching {
				// A detach call may be on its way (its delete not seen
				// accepted): it deletes whatever is under the name, an
				// object created again too. The one on record is gone;
				// the detach stays started, out of every report, until
				// its answer or its next try (which asks the API) ends it.
				c.actual.Update(k, false, func(a *cache.Attachment) { a.AttachmentUID = "" })
				c.touch(k)
				return nil
			}
			if !c.actual.DeleteUnchanged(k, a) {
				// Changed while the API was asked (the controller's own
				// create, made since, may have its answer on record): the
				// API's answer may predate it. Looked at again.
				c.attachmentQueue.Add(name)
				return nil
			}
			if !a.DetachStarted.IsZero() {
				c.cfg.Metrics.ObserveOperation(volume.MetricPluginName(k.Volume), metrics.OperationDetach,
					a.Spec != nil && a.Spec.Migrated, true, c.clock.Since(a.DetachStarted))
			}
			logger.V(2).Info("VolumeAttachment is gone: volume detached", "volume", k.Volume, "node", k.Node)
			c.touch(append(c.reconciler.WantedUnderOtherNames(a), k)...)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	k, spec, err := c.attachmentKey(ctx, va)
	if err != nil {
		// Never act on an attachment that can't be identified: it is left
		// alone rather than risk detaching a volume in use.
		logger.Info("Leaving alone a VolumeAttachment that can't be identified", "volumeAttachment", name, "err", err)
		return nil
	}
	changed := c.actual.Update(k, true, func(a *cache.Attachment) {
		if a.CreatedUID == string(va.UID) {
			// The object the controller created is seen: one the lister
			// shows later is newer.
			a.CreatedUID = ""
		}
		if a.State == cache.Detaching && !a.DetachStarted.IsZero() && va.DeletionTimestamp == nil &&
			a.AttachmentName == name && a.AttachmentUID == string(va.UID) {
			// The object whose delete the controller started, as it was
			// before that delete: an informer event older than the delete
			// says nothing new, and must not make it attached (and
			// reported) again.
			return
		}
		if a.AttachmentUID != "" && a.AttachmentUID != string(va.UID) && a.State == cache.Detaching {
			// Another object of that name (a relist shows the one seen
			// gone and another created): the deletion of the one before
			// is over, and no detach of this one has started. Not so
			// while a detach call may be on its way (started, its delete
			// not seen accepted): it deletes whatever is under the name,
			// this object too, and stays started, out of every report.
			a.DetachStarted, a.Withdrawn, a.DetachWanted = time.Time{}, false, time.Time{}
		}
		a.Kind = volume.KindCSI
		a.AttachmentName = name
		a.AttachmentUID = string(va.UID)
		if a.Spec == nil {
			a.Spec = spec
		}
		if spec != nil {
			a.PluginName = spec.PluginName
		}
		a.AttachError, a.DetachError = "", ""
		switch {
		case va.DeletionTimestamp != nil:
			a.State = cache.Detaching
			if e := va.Status.DetachError; e != nil {
				a.DetachError = e.Message
			}
		case va.Status.Attached:
			a.State = cache.Attached
		default:
			a.State = cache.Uncertain
			if e := va.Status.AttachError; e != nil {
				a.AttachError = e.Message
			}
		}
	})
	if changed {
		c.touch(k)
	}
	return nil
}

// attachmentKey finds the volume a VolumeAttachment attaches, from its PV or
// its inline spec; when the PV is gone, from the key it was recorded under.
func (c *Controller) attachmentKey(ctx context.Context, va *storagev1.VolumeAttachment) (cache.Key, *volume.Spec, error) {
	src := volume.Source{}
	switch {
	case va.Spec.Source.PersistentVolumeName != nil:
		pv, err := c.pvs.Get(*va.Spec.Source.PersistentVolumeName)
		if err != nil {
			if k, ok := c.actual.ByAttachmentName(va.Name); ok {
				return k, nil, nil
			}
			return cache.Key{}, nil, fmt.Errorf("PersistentVolume %s: %w", *va.Spec.Source.PersistentVolumeName, err)
		}
		src.PV = pv
	case va.Spec.Source.InlineVolumeSpec != nil:
		src.PV = &v1.PersistentVolume{Spec: *va.Spec.Source.InlineVolumeSpec}
	default:
		return cache.Key{}, nil, errors.New("VolumeAttachment has no source")
	}
	spec, err := volume.Resolve(klog.FromContext(ctx), src, va.Spec.NodeName, alwaysCSI)
	if err != nil {
		return cache.Key{}, nil, fmt.Errorf("resolve source: %w", err)
	}
	if spec.Kind != volume.KindCSI {
		return cache.Key{}, nil, fmt.Errorf("source of kind %q", spec.Kind)
	}
	if va.Spec.Source.InlineVolumeSpec != nil {
		spec.PV, spec.PVName, spec.InlineSpec = nil, "", va.Spec.Source.InlineVolumeSpec
	}
	return cache.Key{Volume: spec.Name, Node: va.Spec.NodeName}, spec, nil
}

// alwaysCSI decides that an in-tree volume named by a VolumeAttachment was
// migrated: a VolumeAttachment only exists for volumes attached through CSI.
func alwaysCSI(string, string) (volume.Kind, error) { return volume.KindCSI, nil }
