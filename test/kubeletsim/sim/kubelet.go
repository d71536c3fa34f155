package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
)

// kubelet is one node's volume manager: what is mounted there, and what
// node status last listed in use.
type kubelet struct {
	mu sync.Mutex
	// mounted holds, per volume, the pods it is mounted for (kubelet's
	// actual state). A volume leaves it once unmounted for its last pod.
	mounted map[string]sets.Set[types.UID]
	// reported is what node.status.volumesInUse listed at the last status
	// update (kubelet's ReportedInUse): only those volumes are mounted.
	reported sets.Set[string]
	// populated: a status update ran since the start. The first one, before
	// the pods are read again, reports only what is mounted.
	populated bool
}

func newKubelet() *kubelet {
	return &kubelet{mounted: map[string]sets.Set[types.UID]{}, reported: sets.New[string]()}
}

// mountedFor reports whether a volume is mounted for pod uid.
func (k *kubelet) mountedFor(uid types.UID) bool {
	for _, pods := range k.mounted {
		if pods.Has(uid) {
			return true
		}
	}
	return false
}

// desired is the volume manager's desired state of a node: the volumes its
// live pods use, with those pods, and its pods being deleted.
func (s *Simulator) desired(ctx context.Context, nodeName string) (map[string]sets.Set[types.UID], []*v1.Pod, error) {
	logger := klog.FromContext(ctx)
	objs, err := s.pods.ByIndex(podsByNode, nodeName)
	if err != nil {
		return nil, nil, fmt.Errorf("list pods of node %s: %w", nodeName, err)
	}
	want := map[string]sets.Set[types.UID]{}
	var terminating []*v1.Pod
	for _, obj := range objs {
		pod := obj.(*v1.Pod)
		if pod.DeletionTimestamp != nil {
			terminating = append(terminating, pod)
			continue
		}
		if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
			continue
		}
		names, skipped := s.namer.PodVolumeNames(logger, pod)
		for _, err := range skipped {
			logger.V(4).Info("Volume not named yet", "err", err)
		}
		for name := range names {
			if want[name] == nil {
				want[name] = sets.New[types.UID]()
			}
			want[name].Insert(pod.UID)
		}
	}
	return want, terminating, nil
}

// sync mounts and unmounts one node's volumes and finishes the deletion of
// its pods being deleted. It never writes volumesInUse: the status loop
// does.
func (s *Simulator) sync(ctx context.Context, nodeName string) error {
	logger := klog.FromContext(ctx)
	if _, err := s.nodeLister.Get(nodeName); apierrors.IsNotFound(err) {
		// Deleted by the test: a kubelet whose node is gone does nothing.
		return nil
	} else if err != nil {
		return fmt.Errorf("get node %s from cache: %w", nodeName, err)
	}
	want, terminating, err := s.desired(ctx, nodeName)
	if err != nil {
		return err
	}
	k := s.kubelets[nodeName]
	k.mu.Lock()
	defer k.mu.Unlock()

	if s.opts.DeleteTerminatingPods {
		// The containers stop at once; the phase says so first.
		for _, pod := range terminating {
			if err := s.podSucceeded(ctx, pod); err != nil {
				return err
			}
		}
	}
	for name, pods := range k.mounted {
		for uid := range pods {
			if !want[name].Has(uid) {
				pods.Delete(uid)
				logger.V(2).Info("Unmounted volume for pod", "volume", name, "podUID", uid)
			}
		}
		if pods.Len() == 0 {
			delete(k.mounted, name)
			logger.Info("Unmounted volume", "volume", name)
		}
	}
	if err := s.mount(ctx, nodeName, k, want); err != nil {
		return err
	}
	if s.opts.DeleteTerminatingPods {
		for _, pod := range terminating {
			if k.mountedFor(pod.UID) {
				continue
			}
			if err := s.deletePod(ctx, pod); err != nil {
				return err
			}
		}
	}
	return nil
}

// mount mounts, for each pod, the volumes the last status update listed in
// use that a fresh read of node status lists attached (kubelet's
// VerifyControllerAttachedVolume reads the node from the API too).
func (s *Simulator) mount(ctx context.Context, nodeName string, k *kubelet, want map[string]sets.Set[types.UID]) error {
	logger := klog.FromContext(ctx)
	var attached sets.Set[string]
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if !k.reported.Has(name) || k.mounted[name].IsSuperset(want[name]) {
			continue
		}
		if attached == nil {
			node, err := s.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("get node %s: %w", nodeName, err)
			}
			attached = sets.New[string]()
			for _, a := range node.Status.VolumesAttached {
				attached.Insert(string(a.Name))
			}
		}
		if !attached.Has(name) {
			continue
		}
		if k.mounted[name] == nil {
			k.mounted[name] = sets.New[types.UID]()
			logger.Info("Mounted volume", "volume", name)
		}
		k.mounted[name].Insert(want[name].UnsortedList()...)
	}
	return nil
}

// podSucceeded sets a pod being deleted to phase Succeeded, its containers
// terminated, as kubelet reports a pod whose containers stopped.
func (s *Simulator) podSucceeded(ctx context.Context, pod *v1.Pod) error {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return nil
	}
	upd := pod.DeepCopy()
	upd.Status.Phase = v1.PodSucceeded
	now := metav1.Now()
	for _, statuses := range [][]v1.ContainerStatus{upd.Status.InitContainerStatuses, upd.Status.ContainerStatuses, upd.Status.EphemeralContainerStatuses} {
		for i := range statuses {
			if statuses[i].State.Terminated == nil {
				statuses[i].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{Reason: "Completed", FinishedAt: now}}
			}
		}
	}
	_, err := s.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("set pod %s/%s Succeeded: %w", pod.Namespace, pod.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Pod being deleted Succeeded", "pod", klog.KObj(pod))
	return nil
}

// deletePod finishes a pod's deletion, as kubelet does once its containers
// stopped and volumes are unmounted.
func (s *Simulator) deletePod(ctx context.Context, pod *v1.Pod) error {
	err := s.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64(0)),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		// Gone already, or a new pod of the same name.
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete terminating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Deleted terminating pod", "pod", klog.KObj(pod))
	return nil
}

// reconstructed stands for the pods, unknown, that a volume found mounted
// at start was mounted for.
const reconstructed types.UID = "reconstructed"

// reconstruct rebuilds, after a start, what each node has mounted: what its
// node status lists in use and attached (kubelet finds its mounts on disk),
// for the pods there that use it, or for pods gone (unmounted at the first
// sync). Those stay in use until unmounted; the rest waits for the pods to
// be read again.
func (s *Simulator) reconstruct(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, name := range s.nodeNames {
		node, err := s.nodeLister.Get(name)
		if err != nil {
			continue
		}
		want, _, err := s.desired(ctx, name)
		if err != nil {
			continue
		}
		attached := sets.New[string]()
		for _, a := range node.Status.VolumesAttached {
			attached.Insert(string(a.Name))
		}
		k := s.kubelets[name]
		k.mu.Lock()
		for _, v := range node.Status.VolumesInUse {
			k.reported.Insert(string(v))
			if !attached.Has(string(v)) {
				continue
			}
			if pods := want[string(v)]; pods.Len() > 0 {
				k.mounted[string(v)] = pods.Clone()
			} else {
				k.mounted[string(v)] = sets.New(reconstructed)
			}
		}
		if len(k.mounted) > 0 {
			logger.Info("Found volumes mounted", "node", name, "count", len(k.mounted))
		}
		k.mu.Unlock()
	}
}

// statusLoop runs a node's status updates: one at once, then one every
// StatusUpdateFrequency, the nodes' loops spread over that period.
func (s *Simulator) statusLoop(ctx context.Context, nodeName string) {
	logger := klog.FromContext(ctx).WithValues("node", nodeName)
	ctx = klog.NewContext(ctx, logger)
	period := s.opts.StatusUpdateFrequency
	// The nodes of one simulator start together: their second update is
	// spread over the second half of the period.
	next := period/2 + rand.N(period/2+1)
	for {
		if err := s.updateStatus(ctx, nodeName); err != nil && ctx.Err() == nil {
			logger.Error(err, "Status update failed")
		}
		if sleep(ctx, next) != nil {
			return
		}
		next = period
	}
}

// updateStatus is one status update of a node: volumesInUse written when it
// changed, the volumes it lists marked reported in use, the node synced.
func (s *Simulator) updateStatus(ctx context.Context, nodeName string) error {
	node, err := s.nodeLister.Get(nodeName)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get node %s from cache: %w", nodeName, err)
	}
	want, _, err := s.desired(ctx, nodeName)
	if err != nil {
		return err
	}
	k := s.kubelets[nodeName]
	k.mu.Lock()
	inUse := sets.New[string]()
	for name := range k.mounted {
		inUse.Insert(name)
	}
	if k.populated {
		for name := range want {
			inUse.Insert(name)
		}
	}
	k.populated = true
	k.mu.Unlock()

	list := make([]v1.UniqueVolumeName, 0, inUse.Len())
	for _, name := range sets.List(inUse) {
		list = append(list, v1.UniqueVolumeName(name))
	}
	reported := node.Status.VolumesInUse
	if !sameVolumes(list, node.Status.VolumesInUse) {
		var value any // null removes the field
		if len(list) > 0 {
			value = list
		}
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": value}})
		if err != nil {
			return fmt.Errorf("encode patch: %w", err)
		}
		updated, err := s.client.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("patch node %s volumesInUse: %w", nodeName, err)
		}
		klog.FromContext(ctx).Info("Updated volumesInUse", "volumesInUse", list, "previous", node.Status.VolumesInUse)
		reported = updated.Status.VolumesInUse
	}
	k.mu.Lock()
	k.reported = sets.New[string]()
	for _, v := range reported {
		k.reported.Insert(string(v))
	}
	k.mu.Unlock()
	s.queue.Add(nodeName)
	return nil
}

// sameVolumes compares two volume lists as sets: order and duplicates in
// what is already written don't warrant a write.
func sameVolumes(a, b []v1.UniqueVolumeName) bool {
	return sets.New(a...).Equal(sets.New(b...))
}
