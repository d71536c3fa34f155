package cluster

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// TestStatefulSet: a StatefulSet with a volumeClaimTemplate of the
// WaitForFirstConsumer class, through a user's day: created with 3
// replicas, scaled up to 5 and down to 2, restarted (kubectl rollout
// restart). After each step every pod is Running on a node of its volume's
// zone with its volume attached there alone and mounted, and the volumes of
// the pods scaled away are detached; at no moment is a volume attached to
// two nodes.
func TestStatefulSet(t *testing.T) {
	forEachController(t, func(t *testing.T, kind stack.AttachDetach) {
		e := startCluster(t, kind, stack.ClusterOptions{Nodes: 4, Zones: 2})
		ns := e.namespace("sts")
		const name = "web"
		sts := e.c.Client.AppsV1().StatefulSets(ns)
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
			if _, err := sts.Create(ctx, stack.StatefulSet(ns, name, 3, e.c.StorageClass), metav1.CreateOptions{}); err != nil {
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
		t.Logf("volumes watched: %d, none attached to two nodes at once", len(e.watch.Volumes()))
	})
}
