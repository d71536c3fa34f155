package sim

import (
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// As kubelet: the CSINode first, with no driver and every translatable
// plugin migrated; the drivers later, with their own node IDs.
func TestRegistration(t *testing.T) {
	opts := NewOptions()
	opts.Nodes = 2
	opts.NodePrefix = "n-"
	opts.CSIDrivers = []Driver{{Name: "mock.csi.example.com", NodeID: "mock.csi.example.com"}, {Name: "ebs.csi.aws.com"}}
	opts.NodeLabels = map[string]string{v1.LabelTopologyZone: "a"}
	opts.DriverRegistrationDelay = 500 * time.Millisecond
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
		if len(csiNode.Spec.Drivers) != 0 {
			t.Errorf("%s: CSINode created with drivers %v, want none before they register", name, csiNode.Spec.Drivers)
		}
		if got, want := csiNode.Annotations[MigratedPluginsAnnotation], strings.Join(AllMigratedPlugins, ","); got != want {
			t.Errorf("%s: migrated-plugins annotation %q, want every translatable plugin %q", name, got, want)
		}
		if len(AllMigratedPlugins) != 7 {
			t.Errorf("AllMigratedPlugins = %v, want the seven of kubelet v1.37", AllMigratedPlugins)
		}
		if len(csiNode.OwnerReferences) != 1 || csiNode.OwnerReferences[0].Kind != "Node" || csiNode.OwnerReferences[0].Name != name {
			t.Errorf("%s: CSINode owner %v", name, csiNode.OwnerReferences)
		}
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
		if !slices.ContainsFunc(node.Status.Conditions, func(c v1.NodeCondition) bool {
			return c.Type == v1.NodeReady && c.Status == v1.ConditionTrue
		}) {
			t.Errorf("%s: not Ready: %v", name, node.Status.Conditions)
		}

	}
	for _, name := range []string{"n-0", "n-1"} {
		var csiNode *storagev1.CSINode
		eventually(t, ctx, "drivers of "+name, func() (bool, error) {
			var err error
			csiNode, err = client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
			return err == nil && len(csiNode.Spec.Drivers) == 2, err
		})
		ebsID := nodeID(Driver{Name: "ebs.csi.aws.com"}, name)
		if ebsID == name || !strings.HasPrefix(ebsID, "i-") {
			t.Errorf("%s: the EBS driver's node ID %q, want one of its own", name, ebsID)
		}
		wantDrivers := []storagev1.CSINodeDriver{{Name: "mock.csi.example.com", NodeID: "mock.csi.example.com"}, {Name: "ebs.csi.aws.com", NodeID: ebsID}}
		if !slices.EqualFunc(csiNode.Spec.Drivers, wantDrivers, func(a, b storagev1.CSINodeDriver) bool {
			return a.Name == b.Name && a.NodeID == b.NodeID
		}) {
			t.Errorf("%s: CSINode drivers %v, want %v", name, csiNode.Spec.Drivers, wantDrivers)
		}
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"ebs.csi.aws.com":"` + ebsID + `","mock.csi.example.com":"mock.csi.example.com"}`; node.Annotations[nodeIDAnnotation] != want {
			t.Errorf("%s: node ID annotation %q, want %q", name, node.Annotations[nodeIDAnnotation], want)
		}
	}
}

func TestAdoptExisting(t *testing.T) {
	opts := NewOptions()
	opts.Nodes = 2
	opts.NodePrefix = "n-"
	opts.CSIDrivers = []Driver{{Name: "new.csi", NodeID: "id-new"}}
	opts.MigratedPlugins = nil // an older kubelet
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
		return len(cn.Spec.Drivers) == 1 && cn.Spec.Drivers[0].Name == "new.csi" && cn.Spec.Drivers[0].NodeID == "id-new", nil
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
