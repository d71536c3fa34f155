package migration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	ebsPlugin = "kubernetes.io/aws-ebs"
	ebsDriver = "ebs.csi.aws.com"
)

var (
	crdGVR         = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	csiNodeInfoGVR = schema.GroupVersionResource{Group: "csi.storage.k8s.io", Version: "v1alpha1", Resource: "csinodeinfos"}
)

// installCSINodeInfoCRD creates the CRD of manifests/crd/csinodeinfo.yaml and
// waits until discovery serves it, since the controller asks discovery at
// start whether to watch CSINodeInfo objects.
func installCSINodeInfoCRD(ctx context.Context, config *rest.Config) error {
	root, err := framework.ModuleRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, "manifests", "crd", "csinodeinfo.yaml"))
	if err != nil {
		return fmt.Errorf("read CRD manifest: %w", err)
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf("decode CRD manifest: %w", err)
	}
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		return fmt.Errorf("create discovery client: %w", err)
	}
	crd := &unstructured.Unstructured{Object: obj}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create CRD %s: %w", crd.GetName(), err)
	}
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		established := false
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				established = true
			}
		}
		if !established {
			return false, nil
		}
		list, err := disc.ServerResourcesForGroupVersion(csiNodeInfoGVR.GroupVersion().String())
		if err != nil {
			return false, nil // not in discovery yet
		}
		for _, r := range list.APIResources {
			if r.Name == csiNodeInfoGVR.Resource {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for CRD %s to be served: %w", crd.GetName(), err)
	}
	return nil
}

// createCSINodeInfo creates the CSINodeInfo of node, with ebsDriver
// registered and its status as given, in one create as the kubelets that
// wrote CSINodeInfo did (the CRD has no status subresource).
func createCSINodeInfo(t *testing.T, node string, available bool, mechanism string) {
	t.Helper()
	ctx := t.Context()
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	info := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": csiNodeInfoGVR.GroupVersion().String(),
		"kind":       "CSINodeInfo",
		"metadata":   map[string]any{"name": node},
		"spec": map[string]any{"drivers": []any{
			map[string]any{"name": ebsDriver, "nodeID": "i-" + node},
		}},
		"status": map[string]any{"drivers": []any{
			map[string]any{"name": ebsDriver, "available": available, "volumePluginMechanism": mechanism},
		}},
	}}
	created, err := dyn.Resource(csiNodeInfoGVR).Create(ctx, info, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create CSINodeInfo %s: %v", node, err)
	}
	if _, found, _ := unstructured.NestedSlice(created.Object, "status", "drivers"); !found {
		t.Fatalf("CSINodeInfo %s was created without its status", node)
	}
}

// setup creates the test's namespace and deletes its pods at the end, so
// that the controllers of later tests have nothing of it to attach.
func setup(t *testing.T, ns string) {
	t.Helper()
	if _, err := framework.CreateNamespace(t.Context(), cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := cluster.Client.CoreV1().Pods(ns).DeleteCollection(ctx,
			metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
		if err != nil {
			t.Errorf("delete pods of %s: %v", ns, err)
		}
	})
}

// createNode creates a managed, Ready node.
func createNode(t *testing.T, name string) {
	t.Helper()
	if _, err := framework.CreateNode(t.Context(), cluster.Client, framework.Node(name)); err != nil {
		t.Fatal(err)
	}
}

// createMigratedCSINode registers ebsDriver on node and marks the EBS plugin
// migrated there, as a kubelet with CSI migration does.
func createMigratedCSINode(ctx context.Context, t *testing.T, node string) *storagev1.CSINode {
	t.Helper()
	csiNode, err := framework.CreateCSINode(ctx, cluster.Client, node,
		[]storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-"+node)}, ebsPlugin)
	if err != nil {
		t.Fatal(err)
	}
	return csiNode
}

func ebsSource(volumeID string) v1.PersistentVolumeSource {
	return v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: volumeID}}
}

func inlineEBS(name, volumeID string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{
		AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: volumeID},
	}}
}

// createBoundPV creates a claim and an RWO volume bound to each other.
func createBoundPV(t *testing.T, ns, claim string, src v1.PersistentVolumeSource) *v1.PersistentVolume {
	t.Helper()
	pv, _, err := framework.CreateBoundPVC(t.Context(), cluster.Client, ns, claim, src)
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

func createPod(t *testing.T, ns, name, node string, volumes ...v1.Volume) *v1.Pod {
	t.Helper()
	pod, err := framework.CreatePodWithVolumes(t.Context(), cluster.Client, ns, name, node, volumes...)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// getVA returns the VolumeAttachment, or nil when it does not exist.
func getVA(ctx context.Context, name string) (*storagev1.VolumeAttachment, error) {
	va, err := cluster.Client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	return va, nil
}

// waitAttachedVA waits until the VolumeAttachment exists and is attached.
func waitAttachedVA(t *testing.T, name string) *storagev1.VolumeAttachment {
	t.Helper()
	var va *storagev1.VolumeAttachment
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		var err error
		va, err = getVA(t.Context(), name)
		return va != nil && va.Status.Attached, err
	}, "VolumeAttachment %s to be attached", name)
	return va
}

// vasOfNode lists the VolumeAttachments of node.
func vasOfNode(ctx context.Context, node string) ([]string, error) {
	list, err := cluster.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list VolumeAttachments: %w", err)
	}
	var names []string
	for _, va := range list.Items {
		if va.Spec.NodeName == node {
			names = append(names, va.Name)
		}
	}
	return names, nil
}

// volumesAttached returns node.status.volumesAttached.
func volumesAttached(ctx context.Context, node string) ([]v1.AttachedVolume, error) {
	n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", node, err)
	}
	return n.Status.VolumesAttached, nil
}

func listed(attached []v1.AttachedVolume, name string) bool {
	return slices.ContainsFunc(attached, func(a v1.AttachedVolume) bool { return string(a.Name) == name })
}

// attachedExactly checks that node.status.volumesAttached lists names and
// nothing else (a volume listed under its in-tree name too would be attached
// twice as far as kubelet knows).
func attachedExactly(ctx context.Context, node string, names ...string) error {
	attached, err := volumesAttached(ctx, node)
	if err != nil {
		return err
	}
	got := make([]string, 0, len(attached))
	for _, a := range attached {
		got = append(got, string(a.Name))
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(names))
	if !slices.Equal(got, want) {
		return fmt.Errorf("node %s status.volumesAttached = %v, want %v", node, got, want)
	}
	return nil
}

// waitListed waits until node.status.volumesAttached lists name (or, with
// want false, no longer lists it).
func waitListed(t *testing.T, node, name string, want bool) []v1.AttachedVolume {
	t.Helper()
	var attached []v1.AttachedVolume
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		var err error
		attached, err = volumesAttached(t.Context(), node)
		return listed(attached, name) == want, err
	}, "node %s status.volumesAttached listing %s: %v", node, name, want)
	return attached
}

// podEvent returns the message of the first event of the given type on pod
// whose message contains every one of parts, or "".
func podEvent(ctx context.Context, ns, pod, eventType string, parts ...string) (string, error) {
	list, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list events of %s: %w", ns, err)
	}
next:
	for _, e := range list.Items {
		if e.InvolvedObject.Name != pod || e.Type != eventType {
			continue
		}
		for _, p := range parts {
			if !strings.Contains(e.Message, p) {
				continue next
			}
		}
		return e.Message, nil
	}
	return "", nil
}

// waitPodEvent waits for an event podEvent finds.
func waitPodEvent(t *testing.T, ns, pod, eventType string, parts ...string) string {
	t.Helper()
	var msg string
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		var err error
		msg, err = podEvent(t.Context(), ns, pod, eventType, parts...)
		return msg != "", err
	}, "%s event on pod %s/%s containing %q", eventType, ns, pod, parts)
	return msg
}
