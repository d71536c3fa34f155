package cluster

import (
	"context"
	"fmt"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// TestLeaderElection: the control plane with leader election on, as
// production runs it: kube-scheduler, kube-controller-manager and the
// attach/detach controller each hold their Lease in kube-system, and a
// StatefulSet's pod runs with its volume attached. Then the attach/detach
// controller is replaced (SIGTERM, a new replica takes the Lease) and a
// restart of the pod moves nothing it should not.
func TestLeaderElection(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind stack.AttachDetach) {
		e := startCluster(t, kind, stack.ClusterOptions{Nodes: 2, LeaderElection: true})
		leases := []string{"kube-scheduler", "kube-controller-manager"}
		if kind == stack.Ours {
			leases = append(leases, "attach-detach-controller")
		}
		for _, name := range leases {
			l, err := e.c.Client.CoordinationV1().Leases("kube-system").Get(e.ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("Lease kube-system/%s: %v", name, err)
			}
			if !held(l) {
				t.Errorf("Lease kube-system/%s not held: %+v", name, l.Spec)
			}
		}
		ns := e.namespace("elect")
		const name = "db"
		e.step("create with 1 replica", func(ctx context.Context) error {
			if _, err := e.c.Client.AppsV1().StatefulSets(ns).Create(ctx, stack.StatefulSet(ns, name, 1, e.c.StorageClass), metav1.CreateOptions{}); err != nil {
				return err
			}
			pods, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, stepTimeout)
			if err != nil {
				return err
			}
			return e.checkPlacement(ctx, ns, name, pods)
		})
		if kind == stack.Ours {
			e.step("controller replaced", func(ctx context.Context) error {
				before, err := e.c.Client.CoordinationV1().Leases("kube-system").Get(ctx, "attach-detach-controller", metav1.GetOptions{})
				if err != nil {
					return err
				}
				if _, err := e.c.RestartController(ctx); err != nil {
					return err
				}
				l, err := e.c.Client.CoordinationV1().Leases("kube-system").Get(ctx, "attach-detach-controller", metav1.GetOptions{})
				if apierrors.IsNotFound(err) || (err == nil && !held(l)) {
					return fmt.Errorf("Lease attach-detach-controller not held after the restart")
				}
				if err != nil {
					return err
				}
				if *l.Spec.HolderIdentity == *before.Spec.HolderIdentity {
					return fmt.Errorf("Lease still held by the stopped replica %s", *l.Spec.HolderIdentity)
				}
				return nil
			})
		}
		e.step("rolling restart", func(ctx context.Context) error {
			if err := stack.RolloutRestart(ctx, e.c.Client, ns, name); err != nil {
				return err
			}
			pods, err := stack.WaitStatefulSetRunning(ctx, e.c.Client, ns, name, stepTimeout)
			if err != nil {
				return err
			}
			return e.checkPlacement(ctx, ns, name, pods)
		})
	})
}

func held(l *coordinationv1.Lease) bool {
	return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != ""
}
