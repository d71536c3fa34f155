package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// refreshPeriod is how often, after the story, the summary is checked for
// changes and printed again.
const refreshPeriod = 2 * time.Second

// run starts the cluster, tells the story, then watches until ctx ends or
// opts.duration has passed since the start. It stops everything it started
// before it returns.
func run(ctx context.Context, opts options, p *printer) (err error) {
	p.step("Starting a local cluster on 127.0.0.1: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, this controller, CSI drivers and %d hollow nodes in %d zones", opts.nodes, opts.zones)
	c, err := stack.StartCluster(ctx, stack.ClusterOptions{
		Options:    stack.Options{BinDir: opts.binDir, Drivers: []string{stack.MockDriver, stack.EBSDriver}},
		Nodes:      opts.nodes,
		Zones:      opts.zones,
		NodePrefix: nodePrefix,
	})
	if err != nil {
		return err
	}
	dir := c.Cluster.Dir
	defer func() {
		p.step("Stopping every process and removing %s", dir)
		if stopErr := c.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
			return
		}
		p.line("done")
	}()
	client := c.Client
	ctrl := c.Controller
	// The token that reads the secure port, for the curl printed below.
	tokenFile := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tokenFile, []byte(ctrl.Token), 0o600); err != nil {
		return err
	}
	var nodes, placed []string
	for _, n := range c.Nodes {
		nodes = append(nodes, n.Name)
		placed = append(placed, n.Name+" ("+n.Zone+")")
	}
	p.line("etcd, kube-apiserver       %s", c.Cluster.Config.Host)
	p.line("kube-scheduler             default profile (VolumeBinding waits for WaitForFirstConsumer claims)")
	p.line("kube-controller-manager    --controllers=*,-attachdetach: PV binder, StatefulSet, node lifecycle, pod GC, ...")
	p.line("attach-detach-controller   %s (/metrics, /explain; HTTPS, the cluster admin's token)", ctrl.URL)
	p.line("per CSI driver             csi-mock-driver (zonal), csi-attacher, csi-provisioner: %s", strings.Join(c.Drivers, ", "))
	p.line("StorageClass %-13s %s, WaitForFirstConsumer, the default class", c.StorageClass, stack.MockDriver)
	p.line("kubelet (hollow node)      %s (each registered both drivers in its CSINode, with its zone; kubelet lists %s among its migrated plugins)", strings.Join(placed, ", "), awsEBSPlugin)
	p.line("logs, kubeconfig           %s", dir)

	if err := applyClaims(ctx, client); err != nil {
		return err
	}
	w, err := startWatcher(client, p, namespace, nodes)
	if err != nil {
		return err
	}
	defer w.stop()

	if err := statefulSetStory(ctx, opts, p, c, nodes); err != nil {
		return err
	}
	if err := pause(ctx, p, opts.pause, "pods with claims bound to existing volumes"); err != nil {
		return err
	}
	if err := story(ctx, opts, p, client, ctrl, nodes); err != nil {
		return err
	}
	return idle(ctx, opts, p, c.Stack, ctrl, nodes)
}

// story plays the demo's workload and checks each state it leads to.
func story(ctx context.Context, opts options, p *printer, client kubernetes.Interface, c *stack.Controller, nodes []string) error {
	p.step("Claims in namespace %s, each bound to a PersistentVolume", namespace)
	for _, cl := range claims {
		p.line("%-7s %s (%s)", cl.name, cl.about, cl.volumeName())
	}
	p.step("Creating pods: the controller attaches their volumes")
	for _, pd := range firstPods {
		if err := createPod(ctx, client, pd); err != nil {
			return err
		}
	}
	first := placements(firstPods...)
	if err := waitForState(ctx, client, first, nil); err != nil {
		return fmt.Errorf("attach the first pods' volumes: %w", err)
	}
	if err := waitForRunning(ctx, client, firstPods...); err != nil {
		return err
	}
	p.step("Creating pod %s on %s: it wants volume db, attached to %s for db-a (ReadWriteOnce)", waitingPod.name, nodeName(waitingPod.node), nodeName(0))
	if err := createPod(ctx, client, waitingPod); err != nil {
		return err
	}
	if err := waitForEvent(ctx, client, waitingPod.name, "FailedAttachVolume", "Waiting for detach"); err != nil {
		return err
	}
	handedOver := placements(waitingPod)
	if err := waitForState(ctx, client, first, handedOver); err != nil {
		return fmt.Errorf("keep db on %s only: %w", nodeName(0), err)
	}
	p.step("State: every volume attached and mounted; %s waits", waitingPod.name)
	if err := printSummary(ctx, p, client, c, nodes); err != nil {
		return err
	}
	if err := printExplain(ctx, p, c, namespace+"/"+waitingPod.name); err != nil {
		return err
	}

	if err := pause(ctx, p, opts.pause, "deleting pod db-a"); err != nil {
		return err
	}
	p.step("Deleting pod db-a: its kubelet unmounts db, the controller detaches it from %s and attaches it to %s", nodeName(0), nodeName(waitingPod.node))
	if err := client.CoreV1().Pods(namespace).Delete(ctx, "db-a", metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete pod db-a: %w", err)
	}
	var after []placement
	for _, pl := range first {
		if pl.claim.name != "db" {
			after = append(after, pl)
		}
	}
	released := []placement{{claim: claimNamed("db"), node: nodeName(0)}}
	if err := waitForState(ctx, client, append(after, handedOver...), released); err != nil {
		return fmt.Errorf("hand db over to %s: %w", nodeName(waitingPod.node), err)
	}
	if err := waitForRunning(ctx, client, waitingPod); err != nil {
		return err
	}
	p.step("State: db moved to %s", nodeName(waitingPod.node))
	if err := printSummary(ctx, p, client, c, nodes); err != nil {
		return err
	}
	return printExplain(ctx, p, c, namespace+"/"+waitingPod.name)
}

// pause gives the reader time before the next step.
func pause(ctx context.Context, p *printer, d time.Duration, next string) error {
	if d <= 0 {
		return nil
	}
	p.step("Next: %s, in %s", next, d)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// idle keeps the stack running, printing the summary again when the state
// changes, until ctx ends or the demo's duration has passed.
func idle(ctx context.Context, opts options, p *printer, st *stack.Stack, c *stack.Controller, nodes []string) error {
	client := st.Cluster.Client
	var deadline <-chan time.Time
	if opts.duration > 0 {
		remaining := time.Until(p.start.Add(opts.duration))
		p.step("Story done; stopping in %s (--duration)", remaining.Round(time.Second))
		deadline = time.After(remaining)
	} else {
		p.step("Story done. Everything keeps running: press Ctrl-C to stop it and remove everything")
		p.line("try: KUBECONFIG=%s kubectl -n %s delete pod web-1", st.Cluster.Kubeconfig, namespace)
		p.line("     KUBECONFIG=%s kubectl drain --ignore-daemonsets %s", st.Cluster.Kubeconfig, nodes[1])
		p.line("     curl --cacert %s -H \"Authorization: Bearer $(cat %s)\" '%s/explain?pod=%s/web-0'",
			c.CertFile, filepath.Join(st.Cluster.Dir, "admin-token"), c.URL, namespace)
	}
	last, err := fingerprint(ctx, client, nodes)
	if err != nil {
		return err
	}
	ticker := time.NewTicker(refreshPeriod)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return nil
		case <-ticker.C:
		}
		now, err := fingerprint(ctx, client, nodes)
		if err != nil {
			return err
		}
		if now == last {
			continue
		}
		last = now
		p.step("State changed")
		if err := printSummary(ctx, p, client, c, nodes); err != nil {
			return err
		}
	}
}

// fingerprint changes when a VolumeAttachment or the volumes of a node's
// status change.
func fingerprint(ctx context.Context, client kubernetes.Interface, nodes []string) (string, error) {
	var b strings.Builder
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list VolumeAttachments: %w", err)
	}
	for _, va := range vas.Items {
		fmt.Fprintf(&b, "%s %s %v %v;", va.Name, va.UID, va.Status.Attached, va.DeletionTimestamp != nil)
	}
	for _, name := range nodes {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("get node %s: %w", name, err)
		}
		fmt.Fprintf(&b, "%s %v %v;", name, attachedNames(node), inUseNames(node))
	}
	return b.String(), nil
}
