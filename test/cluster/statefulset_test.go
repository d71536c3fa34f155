package cluster

import (
	"context"
	"fmt"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// TestStatefulSet: a StatefulSet with a volumeClaimTemplate of the
// WaitForFirstConsumer class, through a user's day: created with 3
// replicas, scaled up to 5 and down to 2, restarted (kubectl rollout
// restart), and the node of its first pod drained (kubectl drain), the pod
// coming back on the other node of its zone. After each step every pod is
// Running on a node of its volume's zone with its volume attached there
// alone and mounted, and the volumes of the pods scaled away are detached;
// at no moment is a volume attached to two nodes. With Parallel pod
// management the pods of a step start together, their volumes attached side
// by side (the small set); with OrderedReady, the default, one after the
// other (the full set).
func TestStatefulSet(t *testing.T) {
	for _, policy := range []appsv1.PodManagementPolicyType{appsv1.ParallelPodManagement, appsv1.OrderedReadyPodManagement} {
		t.Run(string(policy), func(t *testing.T) {
			if policy == appsv1.OrderedReadyPodManagement {
				fullSet(t)
			}
			forEachController(t, func(t *testing.T, kind stack.AttachDetach) {
				statefulSetDay(t, kind, policy)
			})
		})
	}
}

func statefulSetDay(t *testing.T, kind stack.AttachDetach, policy appsv1.PodManagementPolicyType) {
	e := startCluster(t, kind, stack.ClusterOptions{Nodes: 4, Zones: 2})
	ns := e.namespace("sts")
	const name = "web"
	rolledOut := func(ctx context.Context, replicas int) error {
		pods, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, stepTimeout)
		if err != nil {
			return err
		}
		if len(pods) != replicas {
			return fmt.Errorf("%d pods, want %d", len(pods), replicas)
		}
		return e.checkPlacement(ctx, ns, name, pods)
	}

	e.step("create with 3 replicas", func(ctx context.Context) error {
		sts := stack.StatefulSet(ns, name, 3, e.c.StorageClass)
		sts.Spec.PodManagementPolicy = policy
		if _, err := e.c.Client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
			return err
		}
		return rolledOut(ctx, 3)
	})
	e.step("scale up to 5", func(ctx context.Context) error {
		if err := stack.ScaleStatefulSet(ctx, e.c.Client, ns, name, 5); err != nil {
			return err
		}
		return rolledOut(ctx, 5)
	})
	e.step("scale down to 2", func(ctx context.Context) error {
		if err := stack.ScaleStatefulSet(ctx, e.c.Client, ns, name, 2); err != nil {
			return err
		}
		if err := rolledOut(ctx, 2); err != nil {
			return err
		}
		return e.detached(ctx, ns, stack.StatefulSetClaim(name, 2), stack.StatefulSetClaim(name, 3), stack.StatefulSetClaim(name, 4))
	})
	e.step("rolling restart", func(ctx context.Context) error {
		if err := stack.RolloutRestart(ctx, e.c.Client, ns, name); err != nil {
			return err
		}
		return rolledOut(ctx, 2)
	})
	e.step("drain the node of web-0", func(ctx context.Context) error {
		old, err := e.c.Client.CoreV1().Pods(ns).Get(ctx, name+"-0", metav1.GetOptions{})
		if err != nil {
			return err
		}
		from := old.Spec.NodeName
		if _, err := stack.Drain(ctx, e.c.Client, from, stack.DrainOptions{Timeout: stepTimeout}); err != nil {
			return err
		}
		pods, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, stepTimeout)
		if err != nil {
			return err
		}
		to := pods[0].Spec.NodeName
		if to == from || e.c.ZoneOf(to) != e.c.ZoneOf(from) {
			return fmt.Errorf("web-0 moved from %s (%s) to %s (%s), want another node of the same zone", from, e.c.ZoneOf(from), to, e.c.ZoneOf(to))
		}
		t.Logf("web-0 moved from %s to %s in %s", from, to, e.c.ZoneOf(to))
		return e.checkPlacement(ctx, ns, name, pods)
	})
	t.Logf("volumes watched: %d, none attached to two nodes at once", len(e.watch.Volumes()))
}
