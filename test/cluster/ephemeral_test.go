package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestEphemeralDeployment: a Deployment whose pods each have a generic
// ephemeral volume (spec.volumes[].ephemeral.volumeClaimTemplate of the
// WaitForFirstConsumer class). Nothing is created by the test but the
// Deployment: the ephemeral volume controller creates each pod's claim
// POD-scratch owned by the pod, the scheduler picks the node, the
// provisioner creates the volume in its zone, the attach/detach controller
// attaches it. Created with 3 replicas (the full set then scales up to 5
// and down to 2: the claims of the pods scaled away are deleted with them,
// their volumes detached, then deleted), then the node of one pod is
// drained: its replacement runs on another node with a new claim and a new
// volume, and the old claim and volume are deleted, the volume detached from
// the old node before its deletion started. The pods on other nodes are
// left alone (a DetachWatch guards them), no volume is ever on two nodes.
func TestEphemeralDeployment(t *testing.T) {
	forEachController(t, func(t *testing.T, kind stack.AttachDetach) {
		e := startCluster(t, kind, stack.ClusterOptions{Nodes: 4, Zones: 2})
		guard, err := stack.WatchDetaches(e.ctx, e.c.Client)
		if err != nil {
			t.Fatal(err)
		}
		ns := e.namespace("eph")
		const name = "cache"
		rolledOut := func(ctx context.Context, replicas int) ([]v1.Pod, error) {
			pods, err := stack.WaitDeploymentRunning(ctx, e.c.Client, ns, name, stepTimeout)
			if err != nil {
				return nil, err
			}
			if len(pods) != replicas {
				return nil, fmt.Errorf("%d pods, want %d", len(pods), replicas)
			}
			return pods, e.checkPodVolumes(ctx, pods)
		}
		var pods []v1.Pod
		e.step("create with 3 replicas", func(ctx context.Context) error {
			if _, err := e.c.Client.AppsV1().Deployments(ns).Create(ctx, stack.EphemeralDeployment(ns, name, 3, e.c.StorageClass), metav1.CreateOptions{}); err != nil {
				return err
			}
			pods, err = rolledOut(ctx, 3)
			return err
		})
		if !testing.Short() {
			e.step("scale up to 5", func(ctx context.Context) error {
				if err := stack.ScaleDeployment(ctx, e.c.Client, ns, name, 5); err != nil {
					return err
				}
				pods, err = rolledOut(ctx, 5)
				return err
			})
			e.step("scale down to 2 (volumes deleted)", func(ctx context.Context) error {
				before, err := e.ephemeralVolumes(ctx, pods)
				if err != nil {
					return err
				}
				if err := stack.ScaleDeployment(ctx, e.c.Client, ns, name, 2); err != nil {
					return err
				}
				if pods, err = rolledOut(ctx, 2); err != nil {
					return err
				}
				gone := slices.DeleteFunc(before, func(v ephemeralVolume) bool {
					return slices.ContainsFunc(pods, func(p v1.Pod) bool { return p.UID == v.pod })
				})
				if len(gone) != 3 {
					return fmt.Errorf("%d volumes of pods scaled away, want 3", len(gone))
				}
				return e.volumesDeleted(ctx, guard, gone)
			})
		}
		e.step("drain the node of a pod", func(ctx context.Context) error {
			from := pods[0].Spec.NodeName
			var stay, leave []v1.Pod
			for _, p := range pods {
				if p.Spec.NodeName == from {
					leave = append(leave, p)
				} else {
					stay = append(stay, p)
				}
			}
			if err := guard.Protect(ctx, stay...); err != nil {
				return err
			}
			// The pods drained are guarded by a watch of their own, which
			// must see their eviction and detach: a guard that can fail.
			canary, err := stack.WatchDetaches(ctx, e.c.Client)
			if err != nil {
				return err
			}
			if err := canary.Protect(ctx, leave...); err != nil {
				return err
			}
			old, err := e.ephemeralVolumes(ctx, leave)
			if err != nil {
				return err
			}
			if _, err := stack.Drain(ctx, e.c.Client, from, stack.DrainOptions{Timeout: stepTimeout}); err != nil {
				return err
			}
			after, err := rolledOut(ctx, len(pods))
			if err != nil {
				return err
			}
			replacements, err := e.ephemeralVolumes(ctx, slices.DeleteFunc(after, func(p v1.Pod) bool {
				return slices.ContainsFunc(stay, func(s v1.Pod) bool { return s.UID == p.UID })
			}))
			if err != nil {
				return err
			}
			for _, r := range replacements {
				if r.node == from || slices.ContainsFunc(old, func(o ephemeralVolume) bool { return o.claimUID == r.claimUID || o.pv == r.pv }) {
					return fmt.Errorf("replacement %s on %s with claim %s (PV %s): want another node, a new claim and volume than %v", r.podName, r.node, r.claim, r.pv, old)
				}
				t.Logf("%s: replacement %s on %s (%s) with new claim %s, PV %s", from, r.podName, r.node, e.c.ZoneOf(r.node), r.claim, r.pv)
			}
			if err := e.volumesDeleted(ctx, guard, old); err != nil {
				return err
			}
			if err := canaryCaught(canary, old); err != nil {
				return err
			}
			return guard.Err()
		})
		if err := guard.Err(); err != nil {
			t.Error(err)
		}
	})
}

// canaryCaught checks that the watch guarding the drained pods recorded,
// for each volume, its VolumeAttachment deleted and the volume dropped from
// its node's status, and its pod deleted.
func canaryCaught(w *stack.DetachWatch, drained []ephemeralVolume) error {
	got := w.Violations()
	for _, v := range drained {
		for _, want := range []string{
			"VolumeAttachment " + v.attached + " of PV " + v.pv,
			"status.volumesAttached dropped kubernetes.io/csi/",
			"pod " + strings.Split(v.claim, "/")[0] + "/" + v.podName + " on " + v.node + " being deleted",
		} {
			if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, want) }) {
				return fmt.Errorf("the watch guarding the drained pods did not record %q: %q", want, got)
			}
		}
	}
	return nil
}

// ephemeralVolume is the claim of a pod's generic ephemeral volume, its PV
// and where it is attached.
type ephemeralVolume struct {
	pod                types.UID
	podName            string
	claim              string
	claimUID           types.UID
	pv, node, attached string // attached: the VolumeAttachment's name
}

func (v ephemeralVolume) String() string {
	return fmt.Sprintf("%s (PV %s on %s)", v.claim, v.pv, v.node)
}

// ephemeralVolumes are the pods' generic ephemeral volumes.
func (e *env) ephemeralVolumes(ctx context.Context, pods []v1.Pod) ([]ephemeralVolume, error) {
	var out []ephemeralVolume
	for _, p := range pods {
		for _, name := range stack.PodClaims(&p) {
			claim, err := e.c.Client.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			pv, err := e.c.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			out = append(out, ephemeralVolume{
				pod: p.UID, podName: p.Name, claim: claim.Namespace + "/" + claim.Name, claimUID: claim.UID,
				pv: pv.Name, node: p.Spec.NodeName,
				attached: framework.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, pv.Spec.CSI.Driver, p.Spec.NodeName),
			})
		}
	}
	return out, nil
}

// volumesDeleted waits until the claims, their PVs and their
// VolumeAttachments are gone, and checks in the watch's record that each
// volume was detached (its VolumeAttachment removed) before its PV's
// deletion started: the provisioner deletes only a detached volume.
func (e *env) volumesDeleted(ctx context.Context, w *stack.DetachWatch, volumes []ephemeralVolume) error {
	var left []string
	ok := framework.Poll(e.t, stepTimeout, func() (bool, error) {
		left = nil
		for _, v := range volumes {
			ns, name, _ := strings.Cut(v.claim, "/")
			if _, err := e.c.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, "claim "+v.claim)
			}
			if _, err := e.c.Client.CoreV1().PersistentVolumes().Get(ctx, v.pv, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, "PV "+v.pv)
			}
			if _, err := e.c.Client.StorageV1().VolumeAttachments().Get(ctx, v.attached, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, "VolumeAttachment of "+v.pv+" on "+v.node)
			}
		}
		return len(left) == 0, nil
	})
	if !ok {
		return fmt.Errorf("not deleted after %s: %v", stepTimeout, left)
	}
	var errs []error
	for _, v := range volumes {
		va, _ := w.Deletion(stack.KindVolumeAttachment, v.attached)
		pv, _ := w.Deletion(stack.KindPersistentVolume, v.pv)
		pvStarted := pv.Started
		if pvStarted == 0 {
			pvStarted = pv.Removed
		}
		if va.Removed == 0 || pvStarted == 0 || pvStarted < va.Removed {
			errs = append(errs, fmt.Errorf("PV %s: deletion started at resourceVersion %d, its VolumeAttachment on %s removed at %d: want detached first", v.pv, pvStarted, v.node, va.Removed))
			continue
		}
		e.t.Logf("%s: detached from %s, then deleted (PV gone %.1fs after its VolumeAttachment)", v, v.node, pv.RemovedAt.Sub(va.RemovedAt).Seconds())
	}
	return errors.Join(errs...)
}

// checkPodVolumes checks every claim of every pod (stack.PodClaims): a
// generic ephemeral volume's claim is owned by its pod; each claim's PV is
// in the zone of the pod's node, attached to that node alone (one
// VolumeAttachment, attached), listed in its volumesAttached and in its
// volumesInUse (mounted).
func (e *env) checkPodVolumes(ctx context.Context, pods []v1.Pod) error {
	vas, err := e.c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, pod := range pods {
		node, err := e.c.Client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, v := range pod.Spec.Volumes {
			var claimName string
			switch {
			case v.PersistentVolumeClaim != nil:
				claimName = v.PersistentVolumeClaim.ClaimName
			case v.Ephemeral != nil:
				claimName = pod.Name + "-" + v.Name
			default:
				continue
			}
			claim, err := e.c.Client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claimName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if owner := metav1.GetControllerOf(claim); v.Ephemeral != nil && (owner == nil || owner.Kind != "Pod" || owner.UID != pod.UID) {
				return fmt.Errorf("claim %s of pod %s's ephemeral volume %s: controller %+v, want the pod", claim.Name, pod.Name, v.Name, owner)
			}
			pv, err := e.c.Client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("claim %s: %w", claim.Name, err)
			}
			zone := node.Labels[v1.LabelTopologyZone]
			if got := pvZones(pv); !slices.Equal(got, []string{zone}) {
				return fmt.Errorf("PV %s of %s is in zones %v, its pod's node %s in %s", pv.Name, claim.Name, got, node.Name, zone)
			}
			var on []string
			for _, va := range vas.Items {
				if pvOf(&va) == pv.Name {
					on = append(on, va.Spec.NodeName)
					if va.Spec.NodeName == node.Name && !va.Status.Attached {
						return fmt.Errorf("VolumeAttachment %s of PV %s on %s not attached", va.Name, pv.Name, node.Name)
					}
				}
			}
			if !slices.Equal(on, []string{node.Name}) {
				return fmt.Errorf("PV %s of pod %s on %s: VolumeAttachments on %v", pv.Name, pod.Name, node.Name, on)
			}
			unique := v1.UniqueVolumeName(framework.CSIVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle))
			if !slices.ContainsFunc(node.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == unique }) {
				return fmt.Errorf("%s not in volumesAttached of %s", unique, node.Name)
			}
			if !slices.Contains(node.Status.VolumesInUse, unique) {
				return fmt.Errorf("%s not in volumesInUse of %s", unique, node.Name)
			}
		}
	}
	return nil
}
