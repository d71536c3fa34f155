// Package mechanism holds the two ways a volume gets attached: CSI, through
// VolumeAttachment objects the CSI external-attacher acts on, and in-tree
// attacher plugins. Both implement reconciler.Mechanism.
package mechanism

import (
	"context"
	"fmt"
	"sync"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// CSI attaches by creating a VolumeAttachment and detaches by deleting it.
// It never waits: the VolumeAttachment informer reports the outcome.
type CSI struct {
	client      kubernetes.Interface
	attachments storagelisters.VolumeAttachmentLister
	// ofPV returns the names of the VolumeAttachments whose source is a
	// PersistentVolume (an index of the informer's); nil: none is looked up.
	ofPV func(pv string) []string

	// gone remembers the VolumeAttachments the API said are gone, by name
	// and UID, while the lister may still hold them: a cached copy of an
	// object known gone is not attached, nor detaching.
	mu   sync.Mutex
	gone map[string]types.UID
}

var _ reconciler.Mechanism = (*CSI)(nil)

// NewCSI returns the CSI mechanism. ofPV, when set, names the
// VolumeAttachments of a PersistentVolume (Attach).
func NewCSI(client kubernetes.Interface, attachments storagelisters.VolumeAttachmentLister, ofPV func(pv string) []string) *CSI {
	return &CSI{client: client, attachments: attachments, ofPV: ofPV, gone: map[string]types.UID{}}
}

// Gone reports whether the VolumeAttachment name with uid is known gone
// from the API though the lister may still show it.
func (c *CSI) Gone(name string, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	g, ok := c.gone[name]
	return ok && g == uid
}

// lookup reads a VolumeAttachment from the lister, as absent when the API
// said it is gone; it forgets what the lister no longer shows.
func (c *CSI) lookup(name string) (*storagev1.VolumeAttachment, error) {
	va, err := c.attachments.Get(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	g, known := c.gone[name]
	switch {
	case err != nil && apierrors.IsNotFound(err) && known:
		delete(c.gone, name)
	case err == nil && known && g == va.UID:
		return nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
	case err == nil && known:
		delete(c.gone, name)
	}
	return va, err
}

// Dropped tells that the lister no longer shows the VolumeAttachment name:
// what the API said of it is no longer needed (its informer's deletion
// event calls it, so that no entry outlives the object).
func (c *CSI) Dropped(name string) {
	c.mu.Lock()
	delete(c.gone, name)
	c.mu.Unlock()
}

func (c *CSI) forget(name string, uid types.UID) {
	if uid == "" {
		return
	}
	c.mu.Lock()
	c.gone[name] = uid
	c.mu.Unlock()
}

// Attach creates the VolumeAttachment unless it exists, and reports its state.
func (c *CSI) Attach(ctx context.Context, spec *volume.Spec, node string) (reconciler.AttachResult, error) {
	name := volume.AttachmentName(spec.VolumeHandle, spec.Driver, node)
	res := reconciler.AttachResult{AttachmentName: name}
	va, err := c.lookup(name)
	switch {
	case err == nil:
		return res, attachmentState(va, &res)
	case !apierrors.IsNotFound(err):
		return res, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	if other := c.heldElsewhere(spec, node); other != nil {
		// The reconciler decided on what the controller has identified: a
		// VolumeAttachment it could not (its PersistentVolume was missing
		// when it was read) is in no record, and may hold the volume.
		return res, fmt.Errorf("PersistentVolume %s may still be attached to node %s (VolumeAttachment %s, not identified yet); waiting for it to be read again or to go",
			spec.PVName, other.Spec.NodeName, other.Name)
	}
	va = NewAttachment(name, spec, node)
	res.Created = true
	created, err := c.client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	switch {
	case err == nil:
		res.UID = string(created.UID)
	case !apierrors.IsAlreadyExists(err):
		res.Refused = refused(err)
		return res, fmt.Errorf("create VolumeAttachment %s: %w", name, err)
	}
	return res, nil
}

// refused reports whether err is the API's answer that it did not carry
// out a write, and will not: a request it found invalid, forbidden (an
// admission webhook's denial too) or throttled. A timeout, a server error
// or a connection lost after the request was sent leave it unknown: the
// write may have landed, or may still land.
func refused(err error) bool {
	switch apierrors.ReasonForError(err) {
	case metav1.StatusReasonBadRequest, metav1.StatusReasonUnauthorized, metav1.StatusReasonForbidden,
		metav1.StatusReasonInvalid, metav1.StatusReasonTooManyRequests, metav1.StatusReasonMethodNotAllowed,
		metav1.StatusReasonRequestEntityTooLarge, metav1.StatusReasonUnsupportedMediaType, metav1.StatusReasonNotAcceptable:
		return true
	}
	return false
}

// heldElsewhere returns a VolumeAttachment of spec's PersistentVolume on
// another node than node, when spec is a single-node volume, or nil. The
// reconciler checks the attachments on record first (single-node access);
// this is the last check before a create, for an object on no record.
func (c *CSI) heldElsewhere(spec *volume.Spec, node string) *storagev1.VolumeAttachment {
	if !spec.SingleNode || spec.PVName == "" || c.ofPV == nil {
		return nil
	}
	for _, name := range c.ofPV(spec.PVName) {
		va, err := c.lookup(name)
		if err != nil || va.Spec.NodeName == node || va.Spec.Source.PersistentVolumeName == nil ||
			*va.Spec.Source.PersistentVolumeName != spec.PVName {
			continue
		}
		return va
	}
	return nil
}

func attachmentState(va *storagev1.VolumeAttachment, res *reconciler.AttachResult) error {
	if va.DeletionTimestamp != nil {
		return fmt.Errorf("VolumeAttachment %s is being deleted", va.Name)
	}
	if va.Status.Attached {
		res.Attached = true
		return nil
	}
	if e := va.Status.AttachError; e != nil {
		return &reconciler.AttachError{Message: e.Message}
	}
	return nil
}

// NewAttachment returns the VolumeAttachment that attaches spec to node.
func NewAttachment(name string, spec *volume.Spec, node string) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: spec.Driver,
			NodeName: node,
		},
	}
	if spec.PVName != "" {
		pv := spec.PVName
		va.Spec.Source.PersistentVolumeName = &pv
	} else {
		va.Spec.Source.InlineVolumeSpec = spec.InlineSpec
	}
	return va
}

// Detach deletes the VolumeAttachment; done once the API says it is gone.
func (c *CSI) Detach(ctx context.Context, a cache.Attachment) (bool, error) {
	name := a.AttachmentName
	if name == "" {
		_, driver, handle := volume.Parse(a.Volume)
		name = volume.AttachmentName(handle, driver, a.Node)
	}
	va, err := c.lookup(name)
	if apierrors.IsNotFound(err) {
		// The lister may not have seen it yet (a create whose event is
		// still on its way): only the API can say it is gone.
		err = c.client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil
		case err != nil:
			return false, fmt.Errorf("delete VolumeAttachment %s: %w", name, err)
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	if va.DeletionTimestamp != nil {
		if e := va.Status.DetachError; e != nil {
			return false, fmt.Errorf("VolumeAttachment %s: %s", name, e.Message)
		}
		return false, nil
	}
	uid := va.UID
	err = c.client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case apierrors.IsNotFound(err):
		c.forget(name, uid)
		return true, nil
	case err != nil:
		return false, fmt.Errorf("delete VolumeAttachment %s: %w", name, err)
	}
	return false, nil
}

// Settle reads the VolumeAttachment of a from the API, after a delete of
// unknown outcome: the informer's copy may predate that delete. Gone, the
// volume is detached; being deleted, its detach is under way; otherwise
// the delete did not land (it was refused, or failed before it reached
// the object). What the lister still shows of an object the API no longer
// has is taken as gone from then on (Gone), unless it was not shown yet
// when the GET was sent: then it may be newer than the answer, and is
// taken as there.
func (c *CSI) Settle(ctx context.Context, a cache.Attachment, _ *volume.Spec) (reconciler.Settled, error) {
	name := a.AttachmentName
	if name == "" {
		_, driver, handle := volume.Parse(a.Volume)
		name = volume.AttachmentName(handle, driver, a.Node)
	}
	before, berr := c.attachments.Get(name)
	va, err := c.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	gone := apierrors.IsNotFound(err)
	if err != nil && !gone {
		return reconciler.Settled{}, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	cached, lerr := c.attachments.Get(name)
	// An object the lister shows only since the GET was sent may have been
	// created after the API answered: the answer says nothing of it.
	newer := lerr == nil && (berr != nil || before.UID != cached.UID)
	if lerr == nil && !newer && (gone || cached.UID != va.UID) {
		c.forget(name, cached.UID)
	}
	if gone && newer {
		va = cached
	} else if gone {
		return reconciler.Settled{Detached: true}, nil
	}
	s := reconciler.Settled{UID: string(va.UID)}
	if va.DeletionTimestamp != nil {
		s.Detaching = true
		if e := va.Status.DetachError; e != nil {
			s.Error = e.Message
		}
		return s, nil
	}
	s.Attached = va.Status.Attached
	if e := va.Status.AttachError; e != nil && !s.Attached {
		s.Error = e.Message
	}
	return s, nil
}
