package sim

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

// eventually polls cond until it holds or 10 s have passed.
func eventually(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond()
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// startSim runs a Simulator against a fake clientset; the returned stop
// cancels it and fails the test unless Run returns nil promptly.
func startSim(t *testing.T, opts *Options, objs ...any) (*fake.Clientset, context.Context, func()) {
	t.Helper()
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *v1.Pod:
			_, err = client.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *v1.PersistentVolumeClaim:
			_, err = client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *v1.PersistentVolume:
			_, err = client.CoreV1().PersistentVolumes().Create(ctx, o, metav1.CreateOptions{})
		case *v1.Node:
			_, err = client.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
		case *storagev1.CSINode:
			_, err = client.StorageV1().CSINodes().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected object %T", obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(client, *opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	return client, ctx, func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	}
}

func inUseOf(ctx context.Context, client *fake.Clientset, node string) ([]v1.UniqueVolumeName, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return n.Status.VolumesInUse, nil
}

func setAttached(t *testing.T, ctx context.Context, client *fake.Clientset, node string, names ...string) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.VolumesAttached = attached(names...)
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestRegistration(t *testing.T) {
	opts := NewOptions()
	opts.Nodes = 2
	opts.NodePrefix = "n-"
	opts.CSIDrivers = []Driver{{Name: "mock.csi.example.com", NodeID: "mock.csi.example.com"}, {Name: "ebs.csi.aws.com"}}
	opts.MigratedPlugins = []string{"kubernetes.io/aws-ebs"}
	opts.NodeLabels = map[string]string{v1.LabelTopologyZone: "a"}
	client, ctx, stop := startSim(t, opts)
	defer stop()

	for _, name := range []string{"n-0", "n-1"} {
		var csiNode *storagev1.CSINode
		eventually(t, ctx, "CSINode "+name, func() (bool, error) {
			var err error
			csiNode, err = client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return err == nil, err
		})
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node.Annotations[ManagedAnnotation] != "true" {
			t.Errorf("%s: annotations %v lack %s", name, node.Annotations, ManagedAnnotation)
		}
		if node.Labels[v1.LabelTopologyZone] != "a" || node.Labels[v1.LabelHostname] != name {
			t.Errorf("%s: labels %v, want the node labels and the hostname", name, node.Labels)
		}
		if want := `{"ebs.csi.aws.com":"` + name + `","mock.csi.example.com":"mock.csi.example.com"}`; node.Annotations[nodeIDAnnotation] != want {
			t.Errorf("%s: node ID annotation %q, want %q", name, node.Annotations[nodeIDAnnotation], want)
		}
		if !slices.ContainsFunc(node.Status.Conditions, func(c v1.NodeCondition) bool {
			return c.Type == v1.NodeReady && c.Status == v1.ConditionTrue
		}) {
			t.Errorf("%s: not Ready: %v", name, node.Status.Conditions)
		}
		wantDrivers := []storagev1.CSINodeDriver{{Name: "mock.csi.example.com", NodeID: "mock.csi.example.com"}, {Name: "ebs.csi.aws.com", NodeID: name}}
		if !slices.EqualFunc(csiNode.Spec.Drivers, wantDrivers, func(a, b storagev1.CSINodeDriver) bool {
			return a.Name == b.Name && a.NodeID == b.NodeID
		}) {
			t.Errorf("%s: CSINode drivers %v, want %v", name, csiNode.Spec.Drivers, wantDrivers)
		}
		if got := csiNode.Annotations[MigratedPluginsAnnotation]; got != "kubernetes.io/aws-ebs" {
			t.Errorf("%s: migrated-plugins annotation %q", name, got)
		}
		if len(csiNode.OwnerReferences) != 1 || csiNode.OwnerReferences[0].Kind != "Node" || csiNode.OwnerReferences[0].Name != name {
			t.Errorf("%s: CSINode owner %v", name, csiNode.OwnerReferences)
		}
	}
}

func TestAdoptExisting(t *testing.T) {
	opts := NewOptions()
	opts.Nodes = 2
	opts.NodePrefix = "n-"
	opts.CSIDrivers = []Driver{{Name: "new.csi"}}
	opts.NodeLabels = map[string]string{v1.LabelTopologyZone: "a"}
	notReady := v1.NodeCondition{Type: v1.NodeReady, Status: v1.ConditionFalse}
	existing := []any{
		// n-0: from an earlier run, no annotation, no conditions.
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-0", Labels: map[string]string{"keep": "me"}}},
		// n-1: made NotReady by a test: left so.
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n-1"}, Status: v1.NodeStatus{Conditions: []v1.NodeCondition{notReady}}},
		&storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: "n-0", Annotations: map[string]string{MigratedPluginsAnnotation: "kubernetes.io/gce-pd", "other": "x"}},
			Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "old.csi", NodeID: "o"}}},
		},
	}
	client, ctx, stop := startSim(t, opts, existing...)
	defer stop()

	eventually(t, ctx, "CSINode n-0 updated", func() (bool, error) {
		cn, err := client.StorageV1().CSINodes().Get(ctx, "n-0", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(cn.Spec.Drivers) == 1 && cn.Spec.Drivers[0].Name == "new.csi" && cn.Spec.Drivers[0].NodeID == "n-0", nil
	})
	cn, err := client.StorageV1().CSINodes().Get(ctx, "n-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cn.Annotations[MigratedPluginsAnnotation]; ok || cn.Annotations["other"] != "x" {
		t.Errorf("CSINode annotations %v: want migrated-plugins removed, others kept", cn.Annotations)
	}
	n0, err := client.CoreV1().Nodes().Get(ctx, "n-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n0.Annotations[ManagedAnnotation] != "true" || n0.Labels["keep"] != "me" || n0.Labels[v1.LabelTopologyZone] != "a" {
		t.Errorf("n-0 meta: annotations %v labels %v", n0.Annotations, n0.Labels)
	}
	if len(n0.Status.Conditions) != 1 || n0.Status.Conditions[0].Status != v1.ConditionTrue {
		t.Errorf("n-0 conditions %v, want Ready", n0.Status.Conditions)
	}
	n1, err := client.CoreV1().Nodes().Get(ctx, "n-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n1.Status.Conditions) != 1 || n1.Status.Conditions[0].Status != v1.ConditionFalse {
		t.Errorf("n-1 conditions %v, want left NotReady", n1.Status.Conditions)
	}
}

func TestDelayedCSINode(t *testing.T) {
	opts := NewOptions()
	opts.CSINodeDelay = 300 * time.Millisecond
	client, ctx, stop := startSim(t, opts)
	defer stop()

	eventually(t, ctx, "node", func() (bool, error) {
		_, err := client.CoreV1().Nodes().Get(ctx, "kubeletsim-node-0", metav1.GetOptions{})
		return err == nil, nil
	})
	start := time.Now()
	if _, err := client.StorageV1().CSINodes().Get(ctx, "kubeletsim-node-0", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("CSINode exists before its delay: %v", err)
	}
	eventually(t, ctx, "delayed CSINode", func() (bool, error) {
		_, err := client.StorageV1().CSINodes().Get(ctx, "kubeletsim-node-0", metav1.GetOptions{})
		return err == nil, nil
	})
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("CSINode took %v", waited)
	}
}

func TestVolumesInUse(t *testing.T) {
	const (
		volA = "kubernetes.io/csi/mock.csi.example.com^4"
		volB = "kubernetes.io/csi/mock.csi.example.com^5"
		volE = "kubernetes.io/csi/ebs.csi.aws.com^vol-abc"
	)
	opts := NewOptions()
	opts.Nodes = 2
	opts.NodePrefix = "n-"
	opts.MigratedPlugins = []string{"kubernetes.io/aws-ebs"}
	opts.NoCSINode = true

	pvA := pvWith("pv-a", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.example.com", VolumeHandle: "4"}})
	pvE := pvWith("pv-e", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-abc"}})
	claimB := boundPVC("c-b", "pv-b") // its PV comes later
	pod1 := podWith(claimVol("a", "c-a"), claimVol("b", "c-b"))
	pod1.Name = "p1"
	pod2 := podWith(claimVol("e", "c-e"))
	pod2.Name = "p2"
	client, ctx, stop := startSim(t, opts, pvA, pvE, boundPVC("c-a", "pv-a"), claimB, boundPVC("c-e", "pv-e"), pod1, pod2)
	defer stop()

	waitInUse := func(node string, want ...string) {
		t.Helper()
		wantNames := unique(want...)
		slices.Sort(wantNames) // written sorted
		eventually(t, ctx, fmt.Sprintf("%s volumesInUse %v", node, wantNames), func() (bool, error) {
			got, err := inUseOf(ctx, client, node)
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return slices.Equal(got, wantNames), err
		})
	}

	eventually(t, ctx, "nodes", func() (bool, error) {
		_, err := client.CoreV1().Nodes().Get(ctx, "n-1", metav1.GetOptions{})
		return err == nil, nil
	})
	// Attached, but only A, B and E are used, B has no PV yet; the in-tree
	// name of E is not what a migrated node mounts.
	setAttached(t, ctx, client, "n-0", volB, "kubernetes.io/aws-ebs/vol-abc", volA, volE, "kubernetes.io/csi/other^1")
	waitInUse("n-0", volA, volE)

	// B's PV appears: B is named and in use.
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pvWith("pv-b", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.example.com", VolumeHandle: "5"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitInUse("n-0", volA, volB, volE)

	// Detached by the controller: no longer reported.
	setAttached(t, ctx, client, "n-0", volA, volB)
	waitInUse("n-0", volA, volB)

	// p2 finished: its volume is unmounted.
	p2, err := client.CoreV1().Pods(ns).Get(ctx, "p2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p2.Status.Phase = v1.PodSucceeded
	if _, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, p2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	setAttached(t, ctx, client, "n-0", volA, volB, volE)
	waitInUse("n-0", volA, volB)

	// p1 is being deleted: its volumes are unmounted and the pod is removed.
	p1, err := client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p1.DeletionTimestamp = new(metav1.Now())
	if _, err := client.CoreV1().Pods(ns).Update(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitInUse("n-0")
	eventually(t, ctx, "terminating pod deleted", func() (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	// The other node never had anything: never written.
	if got, err := inUseOf(ctx, client, "n-1"); err != nil || len(got) != 0 {
		t.Errorf("n-1 volumesInUse = %v, %v", got, err)
	}
}

func TestReportUnattached(t *testing.T) {
	opts := NewOptions()
	opts.ReportUnattached = true
	opts.NoCSINode = true
	pv := pvWith("pv-a", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h"}})
	pod := podWith(claimVol("a", "c-a"))
	pod.Spec.NodeName = "kubeletsim-node-0"
	client, ctx, stop := startSim(t, opts, pv, boundPVC("c-a", "pv-a"), pod)
	defer stop()
	eventually(t, ctx, "volume in use before attach", func() (bool, error) {
		got, err := inUseOf(ctx, client, "kubeletsim-node-0")
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return slices.Equal(got, unique("kubernetes.io/csi/d^h")), err
	})
}
