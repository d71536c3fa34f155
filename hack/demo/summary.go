package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Metrics the summary shows: the ones dashboards and alerts use.
var shownMetrics = []string{
	"attachdetach_controller_total_volumes",
	"storage_operation_duration_seconds_count",
	"attach_detach_controller_attachdetach_controller_forced_detaches",
}

// printSummary prints the state: VolumeAttachments, node status, and the
// controller's key metrics.
func printSummary(ctx context.Context, p *printer, client kubernetes.Interface, c *stack.Controller, nodes []string) error {
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list VolumeAttachments: %w", err)
	}
	slices.SortFunc(vas.Items, func(a, b storagev1.VolumeAttachment) int {
		return strings.Compare(a.Spec.NodeName+pvOf(&a), b.Spec.NodeName+pvOf(&b))
	})
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPERSISTENTVOLUME\tATTACHER\tATTACHED\tNAME")
	for i := range vas.Items {
		va := &vas.Items[i]
		state := fmt.Sprint(va.Status.Attached)
		if va.DeletionTimestamp != nil {
			state = "detaching"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", va.Spec.NodeName, pvOf(va), va.Spec.Attacher, state, shortName(va.Name))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p.heading(fmt.Sprintf("VolumeAttachments (%d): created by the controller, attached by csi-attacher", len(vas.Items)))
	p.block(buf.String())

	buf.Reset()
	tw = tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tstatus.volumesAttached (controller)\tIN volumesInUse (kubelet)")
	for _, name := range nodes {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get node %s: %w", name, err)
		}
		attached := attachedNames(node)
		sort.Strings(attached)
		if len(attached) == 0 {
			fmt.Fprintf(tw, "%s\t-\t\n", name)
		}
		inUse := inUseNames(node)
		for i, v := range attached {
			n := ""
			if i == 0 {
				n = name
			}
			mark := "no"
			if slices.Contains(inUse, v) {
				mark = "yes"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", n, v, mark)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p.heading("Node status")
	p.block(buf.String())

	m, err := c.Metrics(ctx)
	if err != nil {
		return err
	}
	var lines []string
	for _, name := range shownMetrics {
		samples := m.Select(name, nil)
		if len(samples) == 0 {
			// A vector has no series before its first increment.
			lines = append(lines, name+" 0 (none yet)")
		}
		for _, s := range samples {
			lines = append(lines, formatSample(s))
		}
	}
	p.heading("Metrics (" + c.URL + "/metrics)")
	p.block(strings.Join(lines, "\n"))
	return nil
}

func pvOf(va *storagev1.VolumeAttachment) string {
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		return *pv
	}
	return "(inline)"
}

// formatSample prints a sample as Prometheus does, labels sorted, without
// empty ones.
func formatSample(s framework.Sample) string {
	keys := make([]string, 0, len(s.Labels))
	for k, v := range s.Labels {
		if v != "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	pairs := make([]string, 0, len(keys))
	for _, k := range keys {
		pairs = append(pairs, fmt.Sprintf("%s=%q", k, s.Labels[k]))
	}
	return fmt.Sprintf("%s{%s} %g", s.Name, strings.Join(pairs, ","), s.Value)
}

// printExplain prints the controller's /explain answer for a pod.
func printExplain(ctx context.Context, p *printer, c *stack.Controller, pod string) error {
	_, raw, err := c.Explain(ctx, pod)
	if err != nil {
		return err
	}
	p.heading("Why? GET " + c.URL + "/explain?pod=" + pod)
	p.block(raw)
	return nil
}
