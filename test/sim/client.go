package sim

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	storagev1client "k8s.io/client-go/kubernetes/typed/storage/v1"
)

// client is the controller's clientset: every write it makes is a point
// where the scheduler lets something else happen (the call is in flight),
// before the call reaches the world (world.react). The fake clientset holds
// a lock while it serves a call, so the task yields before entering it.
type client struct {
	*fake.Clientset
	s *Sim
}

var _ kubernetes.Interface = (*client)(nil)

func newClient(s *Sim) *client {
	f := fake.NewClientset()
	f.PrependReactor("*", "*", s.w.react)
	return &client{Clientset: f, s: s}
}

func (c *client) StorageV1() storagev1client.StorageV1Interface {
	return &storageClient{StorageV1Interface: c.Clientset.StorageV1(), s: c.s}
}

func (c *client) CoreV1() corev1client.CoreV1Interface {
	return &coreClient{CoreV1Interface: c.Clientset.CoreV1(), s: c.s}
}

type storageClient struct {
	storagev1client.StorageV1Interface
	s *Sim
}

func (c *storageClient) VolumeAttachments() storagev1client.VolumeAttachmentInterface {
	return &attachmentClient{VolumeAttachmentInterface: c.StorageV1Interface.VolumeAttachments(), s: c.s}
}

type attachmentClient struct {
	storagev1client.VolumeAttachmentInterface
	s *Sim
}

func (c *attachmentClient) Create(ctx context.Context, va *storagev1.VolumeAttachment, opts metav1.CreateOptions) (*storagev1.VolumeAttachment, error) {
	c.s.yield()
	out, err := c.VolumeAttachmentInterface.Create(ctx, va, opts)
	if err == nil {
		// This controller generation's attach, to be announced (I8).
		c.s.unannounced[pair{attachmentVolume(va), va.Spec.NodeName}] = out.UID
	}
	return out, answered(c.s, err)
}

func (c *attachmentClient) Get(ctx context.Context, name string, opts metav1.GetOptions) (*storagev1.VolumeAttachment, error) {
	c.s.yield()
	va, err := c.VolumeAttachmentInterface.Get(ctx, name, opts)
	if err = answered(c.s, err); err != nil {
		return nil, err
	}
	return va, nil
}

func (c *attachmentClient) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	c.s.yield()
	return answered(c.s, c.VolumeAttachmentInterface.Delete(ctx, name, opts))
}

// answered is a call's answer on its way back: the scheduler may let
// anything happen before it arrives (the informers see the write, the
// attacher acts on it), or the controller may die meanwhile and never get it.
func answered(s *Sim, err error) error {
	if s.current != nil && s.current.killed {
		return errNoAnswer
	}
	if s.yield() {
		return errNoAnswer
	}
	return err
}

var errNoAnswer = errors.New("the controller was killed before the answer came")

type coreClient struct {
	corev1client.CoreV1Interface
	s *Sim
}

func (c *coreClient) Nodes() corev1client.NodeInterface {
	return &nodeClient{NodeInterface: c.CoreV1Interface.Nodes(), s: c.s}
}

type nodeClient struct {
	corev1client.NodeInterface
	s *Sim
}

func (c *nodeClient) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*v1.Node, error) {
	c.s.yield()
	n, err := c.NodeInterface.Patch(ctx, name, pt, data, opts, subresources...)
	if err == nil {
		// Landed: its answer is on its way (faults.go).
		c.s.answerOnWay[name]++
		defer func() {
			if c.s.answerOnWay[name]--; c.s.answerOnWay[name] <= 0 {
				delete(c.s.answerOnWay, name)
			}
		}()
	}
	if err = answered(c.s, err); err != nil {
		return nil, err
	}
	return n, nil
}
