package stack

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// StatefulSetVolume is the name of the volumeClaimTemplate StatefulSet
// gives its pods: pod NAME-i's claim is data-NAME-i.
const StatefulSetVolume = "data"

// RestartedAtAnnotation is the pod template annotation `kubectl rollout
// restart` sets; RolloutRestart sets it the same way.
const RestartedAtAnnotation = "kubectl.kubernetes.io/restartedAt"

// pollInterval is how often the wait helpers read the API.
const pollInterval = 200 * time.Millisecond

// StatefulSet returns a StatefulSet of replicas pods, each with a
// ReadWriteOnce claim of storageClass from the volumeClaimTemplate
// StatefulSetVolume (1Gi, mounted at /data), and a container that runs
// until deleted. OrderedReady pod management and a RollingUpdate, as
// StatefulSets default to; change the result for anything else.
func StatefulSet(ns, name string, replicas int32, storageClass string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	grace := int64(1)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: name,
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					// The fake runtime stops a container at once; the
					// grace period only bounds a kubelet that is gone.
					TerminationGracePeriodSeconds: &grace,
					Containers: []v1.Container{{
						Name:         "app",
						Image:        "registry.k8s.io/pause:3.10",
						VolumeMounts: []v1.VolumeMount{{Name: StatefulSetVolume, MountPath: "/data"}},
					}},
				},
			},
			VolumeClaimTemplates: []v1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: StatefulSetVolume},
				Spec: v1.PersistentVolumeClaimSpec{
					AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
					StorageClassName: &storageClass,
					Resources: v1.VolumeResourceRequirements{
						Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
					},
				},
			}},
		},
	}
}

// StatefulSetClaim is the claim of pod ordinal i of the StatefulSet name.
func StatefulSetClaim(name string, i int) string {
	return StatefulSetVolume + "-" + name + "-" + strconv.Itoa(i)
}

// ScaleStatefulSet sets the StatefulSet's replicas (the scale
// subresource, as kubectl scale does).
func ScaleStatefulSet(ctx context.Context, client kubernetes.Interface, ns, name string, replicas int32) error {
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	if _, err := client.AppsV1().StatefulSets(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "scale"); err != nil {
		return fmt.Errorf("scale StatefulSet %s/%s to %d: %w", ns, name, replicas, err)
	}
	return nil
}

// RolloutRestart restarts the StatefulSet's pods as `kubectl rollout
// restart` does: a new pod template annotation, so the StatefulSet
// controller replaces every pod, one at a time from the highest ordinal.
func RolloutRestart(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{RestartedAtAnnotation: time.Now().Format(time.RFC3339Nano)},
	}}}})
	if err != nil {
		return err
	}
	if _, err := client.AppsV1().StatefulSets(ns).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("restart StatefulSet %s/%s: %w", ns, name, err)
	}
	return nil
}

// WaitStatefulSetRunning waits until the StatefulSet has rolled out: its
// controller has seen its latest spec, every one of its replicas pods
// (NAME-0 ... NAME-(replicas-1)) runs the update revision, is Running and
// Ready and not being deleted, and no other pod of it is left (a scale
// down is done). It returns the pods, by ordinal.
func WaitStatefulSetRunning(ctx context.Context, client kubernetes.Interface, ns, name string, timeout time.Duration) ([]v1.Pod, error) {
	var pods []v1.Pod
	var why string
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		var err error
		pods, why, err = statefulSetRolledOut(ctx, client, ns, name)
		return why == "", err
	})
	if err != nil {
		return nil, fmt.Errorf("StatefulSet %s/%s not rolled out: %s: %w", ns, name, why, err)
	}
	return pods, nil
}

// statefulSetRolledOut returns the pods when the StatefulSet has rolled
// out, else why not.
func statefulSetRolledOut(ctx context.Context, client kubernetes.Interface, ns, name string) ([]v1.Pod, string, error) {
	sts, err := client.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("get StatefulSet %s/%s: %w", ns, name, err)
	}
	replicas := int32(1)
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	st := sts.Status
	switch {
	case st.ObservedGeneration < sts.Generation:
		return nil, "its controller has not seen generation " + strconv.FormatInt(sts.Generation, 10), nil
	case st.UpdateRevision == "":
		return nil, "no update revision yet", nil
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil {
		return nil, "", fmt.Errorf("StatefulSet %s/%s selector: %w", ns, name, err)
	}
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, "", fmt.Errorf("list pods of StatefulSet %s/%s: %w", ns, name, err)
	}
	pods := make([]v1.Pod, replicas)
	var waiting []string
	for _, p := range list.Items {
		i, ok := ordinal(name, p.Name)
		if !ok || !metav1.IsControlledBy(&p, sts) {
			continue
		}
		if i >= int(replicas) {
			waiting = append(waiting, p.Name+" still exists (scaled down)")
			continue
		}
		pods[i] = p
	}
	for i, p := range pods {
		switch {
		case p.Name == "":
			waiting = append(waiting, fmt.Sprintf("%s-%d missing", name, i))
		case p.DeletionTimestamp != nil:
			waiting = append(waiting, p.Name+" being deleted")
		case p.Labels[appsv1.StatefulSetRevisionLabel] != st.UpdateRevision:
			waiting = append(waiting, p.Name+" at revision "+p.Labels[appsv1.StatefulSetRevisionLabel]+", not "+st.UpdateRevision)
		case p.Status.Phase != v1.PodRunning:
			waiting = append(waiting, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
		case !podReady(&p):
			waiting = append(waiting, p.Name+" not Ready")
		}
	}
	if len(waiting) > 0 {
		return nil, strings.Join(waiting, ", "), nil
	}
	return pods, "", nil
}

// ordinal is the ordinal of a pod of the StatefulSet name.
func ordinal(name, pod string) (int, bool) {
	rest, ok := strings.CutPrefix(pod, name+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}

func podReady(p *v1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
		return c.Type == v1.PodReady && c.Status == v1.ConditionTrue
	})
}

// WaitPodRecreated waits until a pod called name exists in ns with another
// UID than old, is Running and Ready, and returns it: a StatefulSet's pod
// re-created after an eviction or a delete.
func WaitPodRecreated(ctx context.Context, client kubernetes.Interface, ns, name string, old types.UID, timeout time.Duration) (*v1.Pod, error) {
	var pod *v1.Pod
	var why string
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			why = "no pod yet"
			return false, nil
		case err != nil:
			return false, fmt.Errorf("get pod %s/%s: %w", ns, name, err)
		case p.UID == old:
			why = "still the old pod"
			return false, nil
		case p.Status.Phase != v1.PodRunning || !podReady(p) || p.DeletionTimestamp != nil:
			why = fmt.Sprintf("new pod %s on %q", p.Status.Phase, p.Spec.NodeName)
			return false, nil
		}
		pod = p
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s not re-created and Running: %s: %w", ns, name, why, err)
	}
	return pod, nil
}

// poll calls cond every pollInterval until it is done, fails, or timeout
// or ctx ends.
func poll(ctx context.Context, timeout time.Duration, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("not done after %s", timeout))
	defer cancel()
	ticker := time.NewTicker(pollInterval)
	defer ticker.Stop()
	for {
		done, err := cond(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-ticker.C:
		}
	}
}
