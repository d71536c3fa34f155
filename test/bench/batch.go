package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// A Batch is a set of volumes a phase adds beside the workload's own, each
// a bound ReadWriteOnce CSI PV with its own claim, created before the
// phase's clock starts, and, while the phase wants it, a pod: volume i's
// on node i mod N of the workload. The phase deletes its batches' pods
// before it ends, so that the next phases find the workload as it was.
type Batch struct {
	Name string // names its objects: "move", "stream", "teardown"
	Size int
}

// Batches of the move and stream phases.
func moveBurst(n int) Batch     { return Batch{Name: "move", Size: n} }
func streamBatch(n int) Batch   { return Batch{Name: "stream", Size: n} }
func teardownBatch(n int) Batch { return Batch{Name: "teardown", Size: n} }

func (b Batch) claim(i int) string { return fmt.Sprintf("claim-%s-%05d", b.Name, i) }

// pod names volume i's pod of a round: a round's pods replace the
// previous round's, deleted before.
func (b Batch) pod(i, round int) string { return fmt.Sprintf("pod-%s-%05d-r%d", b.Name, i, round) }

func (w *Workload) batchHandle(b Batch, i int) string {
	return fmt.Sprintf("%s-vol-%s-%05d", w.Prefix, b.Name, i)
}

func (w *Workload) batchNode(i int) string { return w.NodeName(i % w.Nodes) }

// First returns the batch's first n volume indexes.
func (b Batch) First(n int) []int {
	idx := make([]int, min(n, b.Size))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// CreateBatchVolumes creates the claims and bound PVs of b; no pod uses
// them yet.
func (w *Workload) CreateBatchVolumes(ctx context.Context, client kubernetes.Interface, b Batch) error {
	return parallel(ctx, b.Size, func(ctx context.Context, i int) error {
		return w.createBoundVolume(ctx, client, b.claim(i), w.batchHandle(b, i))
	})
}

// CreateBatchPods creates the pods of round of b's volumes idx.
func (w *Workload) CreateBatchPods(ctx context.Context, client kubernetes.Interface, b Batch, idx []int, round int) error {
	return parallel(ctx, len(idx), func(ctx context.Context, j int) error {
		return w.CreateBatchPod(ctx, client, b, idx[j], round)
	})
}

// CreateBatchPod creates the pod of round of b's volume i.
func (w *Workload) CreateBatchPod(ctx context.Context, client kubernetes.Interface, b Batch, i, round int) error {
	name := b.pod(i, round)
	if _, err := client.CoreV1().Pods(w.Namespace).Create(ctx, w.benchPod(name, w.batchNode(i), b.claim(i)), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// DeleteBatchPods deletes the pods of round of b's volumes idx at once.
func (w *Workload) DeleteBatchPods(ctx context.Context, client kubernetes.Interface, b Batch, idx []int, round int) error {
	return parallel(ctx, len(idx), func(ctx context.Context, j int) error {
		return deletePod(ctx, client, w.Namespace, b.pod(idx[j], round))
	})
}

// addBatch adds to e b's volumes idx, attached to their nodes.
func (w *Workload) addBatch(e *Expectation, b Batch, idx []int) {
	for _, i := range idx {
		e.addVolume(w.batchHandle(b, i), w.batchNode(i))
	}
}

// UniqueName is the name both controllers list a volume of the workload's
// driver by in node.status.
func (w *Workload) UniqueName(handle string) v1.UniqueVolumeName {
	return v1.UniqueVolumeName(csiPlugin + w.Driver + "^" + handle)
}

// batchListing is b's volume i as its node's status lists it once attached.
func (w *Workload) batchListing(b Batch, i int) Listing {
	return Listing{Node: w.batchNode(i), Volume: w.UniqueName(w.batchHandle(b, i))}
}

// MoveSet returns n of the workload's volumes spread evenly over it: on as
// many nodes as it can.
func (w *Workload) MoveSet(n int) []int {
	n = min(n, w.Volumes())
	set := make([]int, 0, n)
	for i := range n {
		set = append(set, i*w.Volumes()/n)
	}
	return slices.Compact(set)
}

// listing is the workload's volume v as its node's status lists it.
func (w *Workload) listing(v int) Listing {
	return Listing{Node: w.NodeName(w.node[v]), Volume: w.UniqueName(w.handle(v))}
}

// SetVolumesInUse writes node's status.volumesInUse as its kubelet does:
// the volumes mounted there, the whole list at once (a merge patch of that
// field alone: the controller's writes of volumesAttached are left alone).
func (w *Workload) SetVolumesInUse(ctx context.Context, client kubernetes.Interface, node string, inUse []v1.UniqueVolumeName) error {
	if inUse == nil {
		inUse = []v1.UniqueVolumeName{}
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": inUse}})
	if err != nil {
		return fmt.Errorf("encode volumesInUse of node %s: %w", node, err)
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("set volumesInUse of node %s: %w", node, err)
	}
	return nil
}
