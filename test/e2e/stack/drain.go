package stack

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// DrainOptions configure Drain.
type DrainOptions struct {
	// Timeout bounds the whole drain, evictions and deletions. Default 2m.
	Timeout time.Duration
	// GracePeriodSeconds overrides each pod's termination grace period;
	// nil keeps the pod's (kubectl drain --grace-period=-1).
	GracePeriodSeconds *int64
	// RetryInterval is the wait before evicting again a pod whose eviction
	// a PodDisruptionBudget refused (429). Default 5s, kubectl's.
	RetryInterval time.Duration
}

// DrainedPod is a pod Drain evicted.
type DrainedPod struct {
	Namespace, Name string
	UID             types.UID
}

// Cordon marks the node unschedulable (kubectl cordon).
func Cordon(ctx context.Context, client kubernetes.Interface, node string) error {
	return setUnschedulable(ctx, client, node, true)
}

// Uncordon marks the node schedulable again (kubectl uncordon).
func Uncordon(ctx context.Context, client kubernetes.Interface, node string) error {
	return setUnschedulable(ctx, client, node, false)
}

func setUnschedulable(ctx context.Context, client kubernetes.Interface, node string, on bool) error {
	patch := fmt.Appendf(nil, `{"spec":{"unschedulable":%t}}`, on)
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("set node %s unschedulable=%t: %w", node, on, err)
	}
	return nil
}

// Drain drains the node as `kubectl drain --ignore-daemonsets
// --delete-emptydir-data --force` does: it cordons the node, evicts every
// pod on it through the pods/eviction subresource (PodDisruptionBudgets
// apply: a refusal, 429, is retried every RetryInterval), all side by side,
// skipping DaemonSet pods and mirror pods, and returns once every evicted
// pod is gone (deleted, or replaced by a pod of the same name). It returns
// the pods it evicted.
func Drain(ctx context.Context, client kubernetes.Interface, node string, o DrainOptions) ([]DrainedPod, error) {
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = 5 * time.Second
	}
	ctx, cancel := context.WithTimeoutCause(ctx, o.Timeout, fmt.Errorf("drain of node %s not done after %s", node, o.Timeout))
	defer cancel()
	if err := Cordon(ctx, client, node); err != nil {
		return nil, err
	}
	list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list pods of node %s: %w", node, err)
	}
	var pods []DrainedPod
	for _, p := range list.Items {
		if skipOnDrain(&p) {
			continue
		}
		pods = append(pods, DrainedPod{Namespace: p.Namespace, Name: p.Name, UID: p.UID})
	}
	errs := make([]error, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Go(func() {
			if errs[i] = evict(ctx, client, p, o); errs[i] == nil {
				errs[i] = waitGone(ctx, client, p)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return pods, fmt.Errorf("drain node %s: %w", node, err)
	}
	return pods, nil
}

// skipOnDrain: kubectl drain leaves DaemonSet pods (--ignore-daemonsets:
// their controller would put them back at once) and mirror pods (the
// kubelet's static pods) where they are.
func skipOnDrain(p *v1.Pod) bool {
	if _, mirror := p.Annotations[v1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	if c := metav1.GetControllerOf(p); c != nil && c.Kind == "DaemonSet" {
		return true
	}
	return false
}

// evict evicts the pod, retrying while a disruption budget refuses.
func evict(ctx context.Context, client kubernetes.Interface, p DrainedPod, o DrainOptions) error {
	eviction := &policyv1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
		DeleteOptions: &metav1.DeleteOptions{
			GracePeriodSeconds: o.GracePeriodSeconds,
			// Evict this pod, not one re-created under its name.
			Preconditions: &metav1.Preconditions{UID: &p.UID},
		},
	}
	for {
		err := client.PolicyV1().Evictions(p.Namespace).Evict(ctx, eviction)
		switch {
		case err == nil, apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Conflict: the UID precondition failed, the pod is gone.
			return nil
		case !apierrors.IsTooManyRequests(err):
			return fmt.Errorf("evict pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("evict pod %s/%s: %w (last refusal: %w)", p.Namespace, p.Name, context.Cause(ctx), err)
		case <-time.After(o.RetryInterval):
		}
	}
}

// waitGone waits until the pod is deleted or another pod took its name.
func waitGone(ctx context.Context, client kubernetes.Interface, p DrainedPod) error {
	return poll(ctx, time.Hour, func(ctx context.Context) (bool, error) {
		got, err := client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("get pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		return got.UID != p.UID, nil
	})
}
