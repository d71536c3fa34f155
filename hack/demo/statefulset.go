package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"text/tabwriter"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

const (
	// statefulSetName is the story's StatefulSet; its pods are pg-0,
	// pg-1, ..., their claims data-pg-0, ...
	statefulSetName     = "pg"
	statefulSetReplicas = 3
)

// statefulSetStory creates a StatefulSet whose claims are provisioned in
// its pods' zones, then drains the node of its first pod: the pod moves to
// the other node of its zone, and its volume with it.
func statefulSetStory(ctx context.Context, opts options, p *printer, c *stack.Cluster, nodes []string) error {
	client := c.Client
	p.step("Creating StatefulSet %s: %d replicas, each with a claim from the volumeClaimTemplate %q of StorageClass %s (WaitForFirstConsumer): a volume is created once the scheduler has picked its pod's node, in that node's zone",
		statefulSetName, statefulSetReplicas, stack.StatefulSetVolume, c.StorageClass)
	sts := stack.StatefulSet(namespace, statefulSetName, statefulSetReplicas, c.StorageClass)
	// Its pods start side by side (OrderedReady would start them one by
	// one, each once the one before is Ready).
	sts.Spec.PodManagementPolicy = appsv1.ParallelPodManagement
	if _, err := client.AppsV1().StatefulSets(namespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create StatefulSet %s: %w", statefulSetName, err)
	}
	pods, err := stack.WaitStatefulSetRunning(ctx, client, namespace, statefulSetName, stateTimeout)
	if err != nil {
		return err
	}
	p.step("State: StatefulSet %s Running, each volume provisioned in its pod's zone and attached to its pod's node", statefulSetName)
	if err := printPlacement(ctx, p, c, pods); err != nil {
		return err
	}
	if err := printSummary(ctx, p, client, c.Controller, nodes); err != nil {
		return err
	}

	// The first pod's zone has another node (main checks --nodes).
	moved := pods[0]
	from := moved.Spec.NodeName
	zone := c.ZoneOf(from)
	pv, err := claimPV(ctx, c, stack.StatefulSetClaim(statefulSetName, 0))
	if err != nil {
		return err
	}
	if err := pause(ctx, p, opts.pause, "draining node "+from); err != nil {
		return err
	}
	p.step("Draining %s (kubectl drain: cordon, then evict its pods through pods/eviction): the StatefulSet re-creates %s, the scheduler puts it on the other node of %s, where its volume %s can go",
		from, moved.Name, zone, pv)
	evicted, err := stack.Drain(ctx, client, from, stack.DrainOptions{Timeout: stateTimeout})
	if err != nil {
		return err
	}
	for _, e := range evicted {
		p.line("evicted %s/%s", e.Namespace, e.Name)
	}
	back, err := stack.WaitPodRecreated(ctx, client, namespace, moved.Name, moved.UID, stateTimeout)
	if err != nil {
		return err
	}
	to := back.Spec.NodeName
	if to == from || c.ZoneOf(to) != zone {
		return fmt.Errorf("%s re-created on %s (%s), want another node of %s", moved.Name, to, c.ZoneOf(to), zone)
	}
	if err := waitAttachedOnlyTo(ctx, c, pv, to); err != nil {
		return err
	}
	if pods, err = stack.WaitStatefulSetRunning(ctx, client, namespace, statefulSetName, stateTimeout); err != nil {
		return err
	}
	p.step("State: %s moved from %s to %s, both in %s: volume %s detached from %s, attached to %s", moved.Name, from, to, zone, pv, from, to)
	if err := printPlacement(ctx, p, c, pods); err != nil {
		return err
	}
	p.step("Uncordoning %s (kubectl uncordon)", from)
	return stack.Uncordon(ctx, client, from)
}

// claimPV is the PV bound to the claim of the demo's namespace.
func claimPV(ctx context.Context, c *stack.Cluster, claim string) (string, error) {
	pvc, err := c.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get claim %s: %w", claim, err)
	}
	if pvc.Spec.VolumeName == "" {
		return "", fmt.Errorf("claim %s not bound", claim)
	}
	return pvc.Spec.VolumeName, nil
}

// waitAttachedOnlyTo waits until the PV's only VolumeAttachment is on node
// and attached.
func waitAttachedOnlyTo(ctx context.Context, c *stack.Cluster, pv, node string) error {
	var where []string
	return waitUntil(ctx, func() (bool, error) {
		vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, fmt.Errorf("list VolumeAttachments: %w", err)
		}
		where = nil
		for _, va := range vas.Items {
			if pvOf(&va) == pv {
				where = append(where, fmt.Sprintf("%s (attached %t)", va.Spec.NodeName, va.Status.Attached))
			}
		}
		return slices.Equal(where, []string{node + " (attached true)"}), nil
	}, func() string {
		return fmt.Sprintf("PV %s attached to %s alone; VolumeAttachments: %v", pv, node, where)
	})
}

// printPlacement prints where each pod of the StatefulSet runs and where
// its volume was provisioned and is attached.
func printPlacement(ctx context.Context, p *printer, c *stack.Cluster, pods []v1.Pod) error {
	vas, err := c.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list VolumeAttachments: %w", err)
	}
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tZONE\tCLAIM\tPERSISTENTVOLUME\tPV ZONE\tATTACHED TO")
	for i, pod := range pods {
		claim := stack.StatefulSetClaim(statefulSetName, i)
		pvName, err := claimPV(ctx, c, claim)
		if err != nil {
			return err
		}
		pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get PV %s: %w", pvName, err)
		}
		var on []string
		for _, va := range vas.Items {
			if pvOf(&va) == pvName && va.Status.Attached {
				on = append(on, va.Spec.NodeName)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%v\n", pod.Name, pod.Spec.NodeName, c.ZoneOf(pod.Spec.NodeName), claim, pvName, pvZone(pv), on)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p.heading("StatefulSet " + statefulSetName)
	p.block(buf.String())
	return nil
}

// pvZone is the zone the PV's node affinity requires ("-": none).
func pvZone(pv *v1.PersistentVolume) string {
	if a := pv.Spec.NodeAffinity; a != nil && a.Required != nil {
		for _, t := range a.Required.NodeSelectorTerms {
			for _, r := range t.MatchExpressions {
				if r.Key == v1.LabelTopologyZone && len(r.Values) > 0 {
					return r.Values[0]
				}
			}
		}
	}
	return "-"
}
