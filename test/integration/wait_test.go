package integration

import (
	"fmt"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Reads, waits and watches on the API objects the controller writes.

// getVA reads a VolumeAttachment; ok is false when it does not exist.
func (e *env) getVA(name string) (*storagev1.VolumeAttachment, bool, error) {
	va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return va, true, nil
}

// attachedInStatus returns the node.status.volumesAttached entry of volume.
func (e *env) attachedInStatus(node, volume string) (v1.AttachedVolume, bool, error) {
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		return v1.AttachedVolume{}, false, err
	}
	for _, av := range n.Status.VolumesAttached {
		if string(av.Name) == volume {
			return av, true, nil
		}
	}
	return v1.AttachedVolume{}, false, nil
}

// waitAttached waits until the volume's VolumeAttachment on node is attached
// and node.status.volumesAttached lists it; it returns the VolumeAttachment.
func (e *env) waitAttached(driver, handle, node string) *storagev1.VolumeAttachment {
	e.t.Helper()
	name := framework.VolumeAttachmentName(handle, driver, node)
	var va *storagev1.VolumeAttachment
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		got, ok, err := e.getVA(name)
		if err != nil || !ok || !got.Status.Attached {
			return false, err
		}
		va = got
		_, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, handle))
		return listed, err
	}, "volume %s attached to node %s (VolumeAttachment %s attached and listed in node status)", handle, node, name)
	return va
}

// waitDetached waits until the volume's VolumeAttachment on node is gone and
// node.status.volumesAttached no longer lists it.
func (e *env) waitDetached(driver, handle, node string) {
	e.t.Helper()
	name := framework.VolumeAttachmentName(handle, driver, node)
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		_, exists, err := e.getVA(name)
		if err != nil || exists {
			return false, err
		}
		_, listed, err := e.attachedInStatus(node, framework.CSIVolumeName(driver, handle))
		return !listed, err
	}, "volume %s detached from node %s (VolumeAttachment %s gone, not in node status)", handle, node, name)
}

// waitVA waits until the VolumeAttachment exists and returns it.
func (e *env) waitVA(name string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	framework.Eventually(e.t, waitTimeout, func() (bool, error) {
		got, ok, err := e.getVA(name)
		va = got
		return ok, err
	}, "VolumeAttachment %s created", name)
	return va
}

// noVAFor returns a check (for framework.Consistently) that fails once a
// VolumeAttachment matches.
func (e *env) noVAFor(match func(*storagev1.VolumeAttachment) bool) func() error {
	return func() error {
		vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range vas.Items {
			if va := &vas.Items[i]; match(va) {
				return fmt.Errorf("unexpected VolumeAttachment %s: attacher %s, node %s", va.Name, va.Spec.Attacher, va.Spec.NodeName)
			}
		}
		return nil
	}
}

// podEvents lists the events about a pod.
func (e *env) podEvents(pod string) ([]v1.Event, error) {
	list, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", pod).String(),
	})
	if err != nil {
		return nil, err
	}
	return list.Items, nil
}

// waitEvent waits for an event on pod with the type, reason and exact message.
func (e *env) waitEvent(pod, eventType, reason, message string) {
	e.t.Helper()
	var seen []string
	ok := framework.Poll(e.t, waitTimeout, func() (bool, error) {
		events, err := e.podEvents(pod)
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, ev := range events {
			if ev.Type == eventType && ev.Reason == reason && ev.Message == message {
				return true, nil
			}
			seen = append(seen, fmt.Sprintf("%s %s %q", ev.Type, ev.Reason, ev.Message))
		}
		return false, nil
	})
	if !ok {
		e.t.Fatalf("no event %s %s %q on pod %s/%s after %s; events seen: %q", eventType, reason, message, e.ns, pod, waitTimeout, seen)
	}
}

// warnings returns the Warning events on pod.
func (e *env) warnings(pod string) ([]string, error) {
	events, err := e.podEvents(pod)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ev := range events {
		if ev.Type == v1.EventTypeWarning {
			out = append(out, ev.Reason+": "+ev.Message)
		}
	}
	slices.Sort(out)
	return out, nil
}

// vaWatch records every change of one VolumeAttachment from the moment it
// starts, so that a test can tell it was never deleted, not even briefly.
type vaWatch struct {
	name    string
	uid     types.UID
	mu      sync.Mutex
	events  []watch.Event
	stopped bool
	stop    func()
	done    chan struct{}
}

// watchVA watches va from its resourceVersion on: nothing that happened to
// it since it was read is missed.
func (e *env) watchVA(va *storagev1.VolumeAttachment) *vaWatch {
	e.t.Helper()
	name := va.Name
	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: va.ResourceVersion,
	})
	if err != nil {
		e.t.Fatalf("watch VolumeAttachment %s: %v", name, err)
	}
	vw := &vaWatch{name: name, uid: va.UID, stop: w.Stop, done: make(chan struct{})}
	go func() {
		defer close(vw.done)
		for ev := range w.ResultChan() {
			vw.mu.Lock()
			vw.events = append(vw.events, ev)
			vw.mu.Unlock()
		}
		vw.mu.Lock()
		vw.stopped = true
		vw.mu.Unlock()
	}()
	e.t.Cleanup(vw.close)
	return vw
}

// intact is an error describing the deletions the watch saw, if any.
func (vw *vaWatch) intact() error {
	if d := vw.deletions(); len(d) != 0 {
		return fmt.Errorf("VolumeAttachment %s: %v", vw.name, d)
	}
	return nil
}

func (vw *vaWatch) close() {
	vw.stop()
	<-vw.done
}

// deletions describes every deletion, deletion request or recreation the
// watch saw; an ended watch is reported too, since it saw nothing more.
func (vw *vaWatch) deletions() []string {
	vw.mu.Lock()
	defer vw.mu.Unlock()
	var out []string
	for _, ev := range vw.events {
		va, ok := ev.Object.(*storagev1.VolumeAttachment)
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("watch %s event %v", ev.Type, ev.Object))
		case ev.Type == watch.Deleted:
			out = append(out, "deleted")
		case va.DeletionTimestamp != nil:
			out = append(out, "deletion requested")
		case va.UID != vw.uid:
			out = append(out, "recreated with UID "+string(va.UID))
		}
	}
	if vw.stopped {
		out = append(out, "watch ended early")
	}
	return out
}

// nodeWatch records every version of a node from the moment it starts, so
// that a test can tell a volume never left node.status.volumesAttached, not
// even for one write.
type nodeWatch struct {
	mu       sync.Mutex
	versions []*v1.Node
	stopped  bool
	stop     func()
	done     chan struct{}
}

// watchNode watches the node from its current resourceVersion on.
func (e *env) watchNode(name string) *nodeWatch {
	e.t.Helper()
	node, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := e.client.CoreV1().Nodes().Watch(e.ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: node.ResourceVersion,
	})
	if err != nil {
		e.t.Fatalf("watch node %s: %v", name, err)
	}
	nw := &nodeWatch{versions: []*v1.Node{node}, stop: w.Stop, done: make(chan struct{})}
	go func() {
		defer close(nw.done)
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*v1.Node)
			nw.mu.Lock()
			if ok && ev.Type != watch.Deleted {
				nw.versions = append(nw.versions, n)
			} else {
				nw.stopped = true
			}
			nw.mu.Unlock()
		}
		nw.mu.Lock()
		nw.stopped = true
		nw.mu.Unlock()
	}()
	e.t.Cleanup(func() {
		nw.stop()
		<-nw.done
	})
	return nw
}

// missing describes every version of the node whose volumesAttached lacks
// one of volumes; an ended watch is reported too.
func (nw *nodeWatch) missing(volumes ...string) []string {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	var out []string
	for _, n := range nw.versions {
		for _, want := range volumes {
			if !slices.ContainsFunc(n.Status.VolumesAttached, func(av v1.AttachedVolume) bool { return string(av.Name) == want }) {
				out = append(out, fmt.Sprintf("resourceVersion %s lists %v, without %s", n.ResourceVersion, n.Status.VolumesAttached, want))
			}
		}
	}
	if nw.stopped {
		out = append(out, "node watch ended early")
	}
	return out
}
