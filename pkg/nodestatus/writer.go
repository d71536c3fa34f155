// Package nodestatus writes node.status.volumesAttached: the list kubelet
// waits on before it mounts a volume. One patch of the status subresource
// carries every change pending for a node; a volume being detached leaves the
// list, and the write is confirmed, before its detach may start. Its Record
// is the one home of what each node's status lists and of the writes under
// way (record.go); the Writer writes (writer.go).
package nodestatus

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// Writer brings node.status.volumesAttached in line with the actual state,
// keeping its Record.
type Writer struct {
	client  kubernetes.Interface
	record  *Record
	setNode func(context.Context, *v1.Node) []cache.Key
	// Hold is how long a write that only adds volumes may wait for the
	// other attaches under way on its node (Record.Hold); zero: none
	// waits.
	Hold  time.Duration
	Clock clock.PassiveClock
}

// NewWriter returns a Writer. setNode records the node facts of the Node a
// status write returns, the newest the controller can know, at least as new
// as the write (kubelet may have mounted a volume just before a withdraw
// landed; only that answer is sure to say so), and returns the keys whose
// decision may change.
func NewWriter(client kubernetes.Interface, record *Record, setNode func(context.Context, *v1.Node) []cache.Key) *Writer {
	return &Writer{client: client, record: record, setNode: setNode, Clock: clock.RealClock{}}
}

// Sync writes the node's report if it changed. It returns the keys whose
// reported flag changed, for the caller to re-queue (a withdrawn volume may
// now be detached), or, when the write waits for other attaches on the node,
// how long until the caller syncs the node again.
//
// A write of a move (ctx's budget.Move priority: a pod waits for the volume
// that changes nodes) waits for nothing.
func (w *Writer) Sync(ctx context.Context, node string) (keys []cache.Key, after time.Duration, err error) {
	hold := w.Hold
	if budget.PriorityOf(ctx) == budget.Move {
		hold = 0
	}
	if after := w.record.Hold(node, w.Clock.Now(), hold); after > 0 {
		klog.FromContext(ctx).V(4).Info("Node status write waits for the attaches under way on the node", "for", after)
		return nil, after, nil
	}
	keys, err = w.write(ctx, node)
	return keys, 0, err
}

func (w *Writer) write(ctx context.Context, node string) ([]cache.Key, error) {
	want, changed := w.record.Begin(node)
	if !changed {
		return nil, nil
	}
	// The lister may not know the Node yet, or any more: only the API's
	// answer says that no status lists anything (a Node deleted and created
	// again may carry what a write just put there).
	patch, err := Patch(want)
	if err != nil {
		return w.record.End(node, want, false), err
	}
	written, err := w.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case apierrors.IsNotFound(err):
		// Gone: what it had mounted is unknown until its deletion is read.
		keys := w.record.NodeGone(node, w.Clock.Now())
		return append(keys, w.record.End(node, nil, true)...), nil
	case err != nil:
		return w.record.End(node, want, false), fmt.Errorf("patch node %s status: %w", node, err)
	}
	// The node's facts as of the write first: a withdrawn volume's detach
	// must see a mount reported before the write.
	keys := w.setNode(ctx, written)
	ended, landed := w.record.EndOn(node, string(written.UID), written.ResourceVersion, want)
	keys = append(keys, ended...)
	if !landed {
		// The Node it landed on was deleted and created again under its
		// name since: the one read now lists nothing of this write.
		return keys, fmt.Errorf("patch node %s status: the write landed on Node %s, replaced since", node, written.UID)
	}
	klog.FromContext(ctx).V(2).Info("Updated node status", "volumesAttached", len(want))
	return keys, nil
}

// Patch returns the merge patch that sets node.status.volumesAttached to
// exactly want (a merge patch replaces a list whole).
func Patch(want []v1.AttachedVolume) ([]byte, error) {
	var list any = want
	if len(want) == 0 {
		list = nil
	}
	b, err := json.Marshal(map[string]any{"status": map[string]any{"volumesAttached": list}})
	if err != nil {
		return nil, fmt.Errorf("encode node status patch: %w", err)
	}
	return b, nil
}
