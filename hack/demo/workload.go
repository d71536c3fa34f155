package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	namespace  = "demo"
	nodePrefix = "demo-node-"
	// awsEBSPlugin is the in-tree plugin the demo's nodes migrate to
	// stack.EBSDriver.
	awsEBSPlugin = "kubernetes.io/aws-ebs"
	// stateTimeout bounds the wait for each state of the story.
	stateTimeout = 60 * time.Second
)

// claim is a PVC bound to a PV of the demo.
type claim struct {
	name   string
	about  string
	modes  []v1.PersistentVolumeAccessMode
	driver string
	handle string
	// inTree, when set, is the PV's source instead of CSI.
	inTree *v1.PersistentVolumeSource
}

// volumeName is the unique name in node status.
func (c claim) volumeName() string { return framework.CSIVolumeName(c.driver, c.handle) }

func (c claim) source() v1.PersistentVolumeSource {
	if c.inTree != nil {
		return *c.inTree
	}
	return framework.CSISource(c.driver, c.handle)
}

// pod is a pod of the demo on node index node.
type pod struct {
	name   string
	node   int
	claims []string
}

// ebsVolumeID is the AWS EBS volume of the migrated claim; the EBS mock
// driver accepts any handle.
const ebsVolumeID = "vol-0a1b2c3d4e5f60718"

var claims = []claim{
	{name: "web-0", about: "ReadWriteOnce, CSI", driver: stack.MockDriver, handle: "demo-web-0"},
	{name: "web-1", about: "ReadWriteOnce, CSI", driver: stack.MockDriver, handle: "demo-web-1"},
	{name: "shared", about: "ReadWriteMany, CSI: attached to two nodes", modes: []v1.PersistentVolumeAccessMode{v1.ReadWriteMany},
		driver: stack.MockDriver, handle: "demo-shared"},
	{name: "db", about: "ReadWriteOnce, CSI: wanted on two nodes", driver: stack.MockDriver, handle: "demo-db"},
	{name: "legacy", about: "in-tree awsElasticBlockStore, migrated to CSI on the nodes", driver: stack.EBSDriver, handle: ebsVolumeID,
		inTree: &v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: ebsVolumeID, FSType: "ext4"}}},
}

// The story's pods: first, then db-b wanting db while db-a holds it.
var (
	firstPods = []pod{
		{name: "web-0", node: 0, claims: []string{"web-0", "shared"}},
		{name: "web-1", node: 1, claims: []string{"web-1", "shared"}},
		{name: "legacy", node: 1, claims: []string{"legacy"}},
		{name: "db-a", node: 0, claims: []string{"db"}},
	}
	waitingPod = pod{name: "db-b", node: 2, claims: []string{"db"}}
)

func claimNamed(name string) claim {
	i := slices.IndexFunc(claims, func(c claim) bool { return c.name == name })
	return claims[i]
}

// applyClaims creates the namespace and the story's claims with their
// PVs, pre-bound, as an administrator creates claims for existing disks
// (the PV controller finds them bound). StartCluster created the
// CSIDrivers.
func applyClaims(ctx context.Context, client kubernetes.Interface) error {
	if _, err := framework.CreateNamespace(ctx, client, namespace); err != nil {
		return err
	}
	for _, c := range claims {
		if _, _, err := framework.CreateBoundPVC(ctx, client, namespace, c.name, c.source(), c.modes...); err != nil {
			return err
		}
	}
	return nil
}

func createPod(ctx context.Context, client kubernetes.Interface, p pod) error {
	_, err := framework.CreatePod(ctx, client, namespace, p.name, nodeName(p.node), p.claims...)
	return err
}

func nodeName(i int) string { return fmt.Sprintf("%s%d", nodePrefix, i) }

// placement is a volume on a node.
type placement struct {
	claim claim
	node  string
}

func (p placement) String() string { return p.claim.volumeName() + " on " + p.node }

// placements lists where the pods' volumes go.
func placements(pods ...pod) []placement {
	var out []placement
	for _, p := range pods {
		for _, c := range p.claims {
			pl := placement{claim: claimNamed(c), node: nodeName(p.node)}
			if !slices.ContainsFunc(out, func(o placement) bool { return o.String() == pl.String() }) {
				out = append(out, pl)
			}
		}
	}
	return out
}

// waitForState waits until every placement of attached is attached by
// csi-attacher, in its node's volumesAttached and volumesInUse, and no
// VolumeAttachment exists for absent.
func waitForState(ctx context.Context, client kubernetes.Interface, attached, absent []placement) error {
	deadline := time.Now().Add(stateTimeout)
	var missing []string
	for {
		var err error
		missing, err = unmet(ctx, client, attached, absent)
		if err != nil {
			return err
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not reached after %s:\n  %s", stateTimeout, strings.Join(missing, "\n  "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func unmet(ctx context.Context, client kubernetes.Interface, attached, absent []placement) ([]string, error) {
	var missing []string
	nodes := map[string]*v1.Node{}
	for _, pl := range attached {
		va, err := client.StorageV1().VolumeAttachments().Get(ctx, vaName(pl), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, pl.String()+": no VolumeAttachment")
			continue
		case err != nil:
			return nil, fmt.Errorf("get VolumeAttachment: %w", err)
		case !va.Status.Attached:
			missing = append(missing, pl.String()+": VolumeAttachment not attached")
			continue
		}
		node, ok := nodes[pl.node]
		if !ok {
			if node, err = client.CoreV1().Nodes().Get(ctx, pl.node, metav1.GetOptions{}); err != nil {
				return nil, fmt.Errorf("get node: %w", err)
			}
			nodes[pl.node] = node
		}
		name := pl.claim.volumeName()
		if !slices.Contains(attachedNames(node), name) {
			missing = append(missing, pl.String()+": not in node status.volumesAttached")
		}
		if !slices.Contains(inUseNames(node), name) {
			missing = append(missing, pl.String()+": not in node status.volumesInUse")
		}
	}
	for _, pl := range absent {
		_, err := client.StorageV1().VolumeAttachments().Get(ctx, vaName(pl), metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("get VolumeAttachment: %w", err)
		default:
			missing = append(missing, pl.String()+": VolumeAttachment still exists")
		}
	}
	return missing, nil
}

func vaName(pl placement) string {
	return framework.VolumeAttachmentName(pl.claim.handle, pl.claim.driver, pl.node)
}

// waitForEvent waits for an event on the pod with reason and a message
// containing text.
func waitForEvent(ctx context.Context, client kubernetes.Interface, podName, reason, text string) error {
	deadline := time.Now().Add(stateTimeout)
	for {
		events, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list events: %w", err)
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.Name == podName && ev.Reason == reason && strings.Contains(ev.Message, text) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s event %q on pod %s/%s after %s", reason, text, namespace, podName, stateTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitForRunning waits until the pods are Running: their kubelets mounted
// their volumes.
func waitForRunning(ctx context.Context, client kubernetes.Interface, pods ...pod) error {
	deadline := time.Now().Add(stateTimeout)
	for _, p := range pods {
		for {
			got, err := client.CoreV1().Pods(namespace).Get(ctx, p.name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("get pod %s: %w", p.name, err)
			}
			if got.Status.Phase == v1.PodRunning {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("pod %s/%s not Running after %s (phase %s)", namespace, p.name, stateTimeout, got.Status.Phase)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// waitUntil polls cond until it holds, for at most stateTimeout; what says
// what was waited for when it does not.
func waitUntil(ctx context.Context, cond func() (bool, error), what func() string) error {
	deadline := time.Now().Add(stateTimeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not reached after %s: %s", stateTimeout, what())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
