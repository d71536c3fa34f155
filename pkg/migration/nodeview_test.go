package migration

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	node     = "node-1"
	ebs      = "kubernetes.io/aws-ebs"
	ebsCSI   = "ebs.csi.aws.com"
	portworx = "kubernetes.io/portworx-volume"
)

func csiNode(name, migrated string, drivers ...string) *storagev1.CSINode {
	n := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if migrated != "" {
		n.Annotations = map[string]string{v1.MigratedPluginsAnnotationKey: migrated}
	}
	for _, d := range drivers {
		n.Spec.Drivers = append(n.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: name})
	}
	return n
}

// csiNodeInfo builds the unstructured object a dynamic informer delivers.
func csiNodeInfo(name string, statusDrivers ...map[string]any) *unstructured.Unstructured {
	drivers := make([]any, 0, len(statusDrivers))
	for _, d := range statusDrivers {
		drivers = append(drivers, d)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "csi.storage.k8s.io/v1alpha1",
		"kind":       "CSINodeInfo",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{"drivers": []any{
			map[string]any{"name": ebsCSI, "nodeID": "i-123", "topologyKeys": []any{"topology.ebs.csi.aws.com/zone"}},
		}},
		"status": map[string]any{"drivers": drivers},
	}}
}

func driverStatus(name string, available bool, mechanism string) map[string]any {
	return map[string]any{"name": name, "available": available, "volumePluginMechanism": mechanism}
}

func csiNodeLister(t *testing.T, objs ...*storagev1.CSINode) storagelisters.CSINodeLister {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, o := range objs {
		if err := idx.Add(o); err != nil {
			t.Fatalf("add CSINode: %v", err)
		}
	}
	return storagelisters.NewCSINodeLister(idx)
}

func csiNodeInfoLister(t *testing.T, objs ...*unstructured.Unstructured) cache.GenericLister {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, o := range objs {
		if err := idx.Add(o); err != nil {
			t.Fatalf("add CSINodeInfo: %v", err)
		}
	}
	return cache.NewGenericLister(idx, CSINodeInfoGVR.GroupResource())
}

var errBroken = errors.New("cache broken")

// failingCSINodes fails every lookup: proves a decision needed none, or
// that a lookup error other than NotFound is passed on.
type failingCSINodes struct{}

func (failingCSINodes) List(labels.Selector) ([]*storagev1.CSINode, error) { return nil, errBroken }
func (failingCSINodes) Get(string) (*storagev1.CSINode, error)             { return nil, errBroken }

func TestDecision(t *testing.T) {
	malformed := csiNodeInfo(node)
	malformed.Object["status"] = map[string]any{"drivers": "not-a-list"}
	badType := csiNodeInfo(node, map[string]any{"name": ebsCSI, "available": "yes", "volumePluginMechanism": "csi"})

	tests := []struct {
		name      string
		csiNodes  storagelisters.CSINodeLister // nil: use csiNodeLister(nodes...)
		nodes     []*storagev1.CSINode
		infos     []*unstructured.Unstructured
		withInfos bool // pass a CSINodeInfo lister
		opts      []Option
		plugin    string
		want      Decision
		wantErr   string // exact message
		wantIs    error
		missing   bool // error is a NodeInfoMissingError
	}{
		{name: "iscsi is never migrated: no lookup", csiNodes: failingCSINodes{}, plugin: volume.ISCSIPluginName,
			want: Decision{Kind: volume.KindInTree}},
		{name: "fc is never migrated: no lookup", csiNodes: failingCSINodes{}, plugin: volume.FCPluginName,
			want: Decision{Kind: volume.KindInTree}},
		{name: "unknown plugin", csiNodes: failingCSINodes{}, plugin: "kubernetes.io/rbd",
			want: Decision{Kind: volume.KindInTree}},

		// CSINode.
		{name: "csinode: migrated and installed",
			nodes:  []*storagev1.CSINode{csiNode(node, " kubernetes.io/gce-pd , kubernetes.io/aws-ebs ", "pd.csi.storage.gke.io", ebsCSI)},
			plugin: ebs, want: Decision{Kind: volume.KindCSI, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode: migrated, driver missing",
			nodes:  []*storagev1.CSINode{csiNode(node, "kubernetes.io/aws-ebs", "pd.csi.storage.gke.io")},
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINode},
			wantErr: "in-tree plugin kubernetes.io/aws-ebs is migrated on node node-1 but driver ebs.csi.aws.com is not installed"},
		{name: "csinode: other plugins migrated",
			nodes:  []*storagev1.CSINode{csiNode(node, "kubernetes.io/gce-pd", ebsCSI)},
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode: no annotation",
			nodes:  []*storagev1.CSINode{csiNode(node, "", ebsCSI)},
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode: prefix of a plugin name is not a match",
			nodes:  []*storagev1.CSINode{csiNode(node, "kubernetes.io/aws-ebs-x", ebsCSI)},
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode with the annotation wins over a stale csinodeinfo",
			nodes: []*storagev1.CSINode{csiNode(node, "kubernetes.io/gce-pd", ebsCSI)},
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode with an empty annotation says no plugin is migrated",
			nodes: []*storagev1.CSINode{emptyAnnotation(csiNode(node, "", ebsCSI))},
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode without annotation: csinodeinfo says csi",
			nodes: []*storagev1.CSINode{csiNode(node, "", ebsCSI)},
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindCSI, Driver: ebsCSI, Source: SourceCSINodeInfo}},
		{name: "csinode without annotation: csinodeinfo says in-tree",
			nodes: []*storagev1.CSINode{csiNode(node, "", ebsCSI)},
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "in-tree"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINodeInfo}},
		{name: "csinode without annotation: csinodeinfo says csi, driver unavailable",
			nodes: []*storagev1.CSINode{csiNode(node, "", ebsCSI)},
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, false, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINodeInfo},
			wantErr: "CSI driver ebs.csi.aws.com is not available on node node-1 (CSINodeInfo)"},
		{name: "csinode without annotation, CRD watched, no csinodeinfo of the node",
			nodes: []*storagev1.CSINode{csiNode(node, "", ebsCSI)},
			infos: []*unstructured.Unstructured{csiNodeInfo("node-2", driverStatus(ebsCSI, true, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINode}},
		{name: "csinode lookup error", csiNodes: failingCSINodes{}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINode}, wantIs: errBroken},

		// CSINodeInfo.
		{name: "csinodeinfo: csi and available",
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindCSI, Driver: ebsCSI, Source: SourceCSINodeInfo}},
		{name: "csinodeinfo: in-tree",
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "in-tree"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINodeInfo}},
		{name: "csinodeinfo: in-tree, driver unavailable",
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, false, "in-tree"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINodeInfo}},
		{name: "csinodeinfo: csi but unavailable",
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, false, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINodeInfo},
			wantErr: "CSI driver ebs.csi.aws.com is not available on node node-1 (CSINodeInfo)"},
		{name: "csinodeinfo: no entry for the driver",
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus("pd.csi.storage.gke.io", true, "csi"))}, withInfos: true,
			plugin: ebs, want: Decision{Kind: volume.KindInTree, Driver: ebsCSI, Source: SourceCSINodeInfo}},
		{name: "csinodeinfo: unknown mechanism",
			infos: []*unstructured.Unstructured{csiNodeInfo(node, driverStatus(ebsCSI, true, "flex"))}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINodeInfo},
			wantErr: `CSINodeInfo node-1: driver ebs.csi.aws.com has unknown volumePluginMechanism "flex"`},
		{name: "csinodeinfo: malformed drivers list",
			infos: []*unstructured.Unstructured{malformed}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINodeInfo}, wantErr: "parse CSINodeInfo node-1: "},
		{name: "csinodeinfo: malformed field type",
			infos: []*unstructured.Unstructured{badType}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI, Source: SourceCSINodeInfo}, wantErr: "parse CSINodeInfo node-1: "},

		// Neither.
		{name: "neither object, CRD watched",
			nodes: []*storagev1.CSINode{csiNode("node-2", ebs, ebsCSI)}, infos: []*unstructured.Unstructured{csiNodeInfo("node-2")}, withInfos: true,
			plugin: ebs, want: Decision{Driver: ebsCSI}, missing: true,
			wantErr: "waiting for CSINode or CSINodeInfo node-1 to decide whether in-tree plugin kubernetes.io/aws-ebs is migrated"},
		{name: "no CSINode, CRD not watched",
			plugin: portworx, want: Decision{Driver: "pxd.portworx.com"}, missing: true,
			wantErr: "waiting for CSINode node-1 to decide whether in-tree plugin kubernetes.io/portworx-volume is migrated"},

		// Completed migrations.
		{name: "completed migration needs no lookup", csiNodes: failingCSINodes{},
			opts:   []Option{WithCompletedMigrations(UpstreamCompletedMigrations()...)},
			plugin: ebs, want: Decision{Kind: volume.KindCSI, Driver: ebsCSI, Source: SourceMigrationComplete}},
		// v1.37 removed portworx's feature gate: complete, as the others,
		// whatever the node's CSINode says.
		{name: "portworx is complete upstream",
			opts:   []Option{WithCompletedMigrations(UpstreamCompletedMigrations()...)},
			nodes:  []*storagev1.CSINode{csiNode(node, "")},
			plugin: portworx, want: Decision{Kind: volume.KindCSI, Driver: "pxd.portworx.com", Source: SourceMigrationComplete}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := tc.csiNodes
			if nodes == nil {
				nodes = csiNodeLister(t, tc.nodes...)
			}
			var infos cache.GenericLister
			if tc.withInfos {
				infos = csiNodeInfoLister(t, tc.infos...)
			}
			view := NewNodeView(nodes, infos, tc.opts...)

			got, err := view.Decision(node, tc.plugin)
			if got != tc.want {
				t.Errorf("Decision = %+v, want %+v", got, tc.want)
			}
			switch {
			case tc.wantIs != nil:
				if !errors.Is(err, tc.wantIs) {
					t.Errorf("error = %v, want one wrapping %v", err, tc.wantIs)
				}
			case tc.wantErr == "":
				if err != nil {
					t.Errorf("unexpected error: %v", err)
				}
			case err == nil || !strings.HasPrefix(err.Error(), tc.wantErr):
				t.Errorf("error = %v, want %q", err, tc.wantErr)
			}
			var missing *NodeInfoMissingError
			if errors.As(err, &missing) != tc.missing {
				t.Errorf("error %v is a NodeInfoMissingError: %v, want %v", err, !tc.missing, tc.missing)
			}

			// Decide is Decision's Kind, with the same error.
			kind, derr := view.Decide(node, tc.plugin)
			if kind != tc.want.Kind || !sameError(derr, err) {
				t.Errorf("Decide = (%q, %v), want (%q, %v)", kind, derr, tc.want.Kind, err)
			}
		})
	}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Error() == b.Error()
}

func TestTypedErrors(t *testing.T) {
	view := NewNodeView(csiNodeLister(t, csiNode(node, ebs)), nil)
	_, err := view.Decision(node, ebs)
	var notInstalled *DriverNotInstalledError
	if !errors.As(err, &notInstalled) || *notInstalled != (DriverNotInstalledError{Plugin: ebs, Node: node, Driver: ebsCSI}) {
		t.Errorf("error = %#v, want a DriverNotInstalledError", err)
	}

	view = NewNodeView(csiNodeLister(t), csiNodeInfoLister(t))
	_, err = view.Decision(node, ebs)
	var missing *NodeInfoMissingError
	if !errors.As(err, &missing) || missing.Node != node || missing.Plugin != ebs ||
		!reflect.DeepEqual(missing.Objects, []string{"CSINode", "CSINodeInfo"}) {
		t.Errorf("error = %#v, want a NodeInfoMissingError for both objects", err)
	}
}

func TestParseCSINodeInfo(t *testing.T) {
	info, err := ParseCSINodeInfo(csiNodeInfo(node, driverStatus(ebsCSI, true, "csi")))
	if err != nil {
		t.Fatalf("ParseCSINodeInfo: %v", err)
	}
	want := &CSINodeInfo{
		Name: node,
		Spec: CSINodeInfoSpec{Drivers: []CSIDriverInfoSpec{
			{Name: ebsCSI, NodeID: "i-123", TopologyKeys: []string{"topology.ebs.csi.aws.com/zone"}},
		}},
		Status: CSINodeInfoStatus{Drivers: []CSIDriverInfoStatus{
			{Name: ebsCSI, Available: true, VolumePluginMechanism: "csi"},
		}},
	}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("ParseCSINodeInfo = %+v, want %+v", info, want)
	}

	if _, err := ParseCSINodeInfo(csiNode(node, "")); err == nil {
		t.Errorf("a typed object must be rejected")
	}
}

func TestCSINodeInfoGVR(t *testing.T) {
	if got := CSINodeInfoGVR.String(); got != "csi.storage.k8s.io/v1alpha1, Resource=csinodeinfos" {
		t.Errorf("CSINodeInfoGVR = %s", got)
	}
}

func TestDecisionOrigin(t *testing.T) {
	for _, tc := range []struct {
		source, want string
	}{
		{SourceCSINode, "CSINode node-1 (annotation storage.alpha.kubernetes.io/migrated-plugins, spec.drivers)"},
		{SourceCSINodeInfo, "CSINodeInfo node-1 (status.drivers)"},
		{SourceMigrationComplete, "completed-migration policy: migrated on every node"},
		{SourceNone, "never migrated: the plugin has no CSI driver"},
	} {
		if got := (Decision{Source: tc.source}).Origin(node); got != tc.want {
			t.Errorf("Origin of %q = %q, want %q", tc.source, got, tc.want)
		}
	}
}

func TestCompletedMigrations(t *testing.T) {
	perNode, err := CompletedMigrations(PolicyPerNode)
	if err != nil || len(perNode) != 0 {
		t.Errorf("CompletedMigrations(per-node) = (%v, %v), want none", perNode, err)
	}
	completed, err := CompletedMigrations(PolicyCompleted)
	// kube-controller-manager v1.37.2's csimigration.PluginManager:
	// IsMigrationCompleteForPlugin is true for every plugin that migrates
	// (portworx-volume's gate is gone); iSCSI and FC never migrate.
	want := []string{"kubernetes.io/aws-ebs", "kubernetes.io/gce-pd", "kubernetes.io/azure-disk", "kubernetes.io/cinder",
		"kubernetes.io/vsphere-volume", "kubernetes.io/azure-file", "kubernetes.io/portworx-volume"}
	if err != nil || !sameSet(completed, want) {
		t.Errorf("CompletedMigrations(completed) = (%v, %v), want %v", completed, err, want)
	}
	if _, err := CompletedMigrations("upstream"); err == nil || !strings.Contains(err.Error(), `"upstream"`) ||
		!strings.Contains(err.Error(), "per-node, completed") {
		t.Errorf("CompletedMigrations(upstream) error = %v, want one naming the value and the valid ones", err)
	}

	// Per node, a node without CSINode waits; completed, it is CSI at once.
	for _, tc := range []struct {
		policy  string
		want    Decision
		missing bool
	}{
		{PolicyPerNode, Decision{Driver: ebsCSI}, true},
		{PolicyCompleted, Decision{Kind: volume.KindCSI, Driver: ebsCSI, Source: SourceMigrationComplete}, false},
	} {
		plugins, _ := CompletedMigrations(tc.policy)
		got, err := NewNodeView(csiNodeLister(t), nil, WithCompletedMigrations(plugins...)).Decision(node, ebs)
		var missing *NodeInfoMissingError
		if got != tc.want || errors.As(err, &missing) != tc.missing {
			t.Errorf("%s: Decision = (%+v, %v), want (%+v, missing %v)", tc.policy, got, err, tc.want, tc.missing)
		}
	}
}

func sameSet(a, b []string) bool {
	set := map[string]bool{}
	for _, s := range a {
		set[s] = true
	}
	if len(set) != len(a) || len(a) != len(b) {
		return false
	}
	for _, s := range b {
		if !set[s] {
			return false
		}
	}
	return true
}

func emptyAnnotation(n *storagev1.CSINode) *storagev1.CSINode {
	n.Annotations = map[string]string{v1.MigratedPluginsAnnotationKey: ""}
	return n
}

// The CSINodeInfo lister comes and goes with its CRD.
func TestSetCSINodeInfos(t *testing.T) {
	view := NewNodeView(csiNodeLister(t), nil)
	var missing *NodeInfoMissingError
	if _, err := view.Decision(node, ebs); !errors.As(err, &missing) || len(missing.Objects) != 1 {
		t.Fatalf("without the CRD: error = %v, want waiting for the CSINode only", err)
	}
	view.SetCSINodeInfos(csiNodeInfoLister(t, csiNodeInfo(node, driverStatus(ebsCSI, true, "csi"))))
	got, err := view.Decision(node, ebs)
	if want := (Decision{Kind: volume.KindCSI, Driver: ebsCSI, Source: SourceCSINodeInfo}); err != nil || got != want {
		t.Errorf("CRD installed: Decision = (%+v, %v), want %+v", got, err, want)
	}
	view.SetCSINodeInfos(nil)
	if _, err := view.Decision(node, ebs); !errors.As(err, &missing) || len(missing.Objects) != 1 {
		t.Errorf("CRD removed: error = %v, want waiting for the CSINode only", err)
	}
}

// A driver not registered yet says since when it could have been: when its
// kubelet created the CSINode, at start.
func TestDriverNotInstalledSince(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	cn := csiNode("node-1", "kubernetes.io/aws-ebs")
	cn.CreationTimestamp = created
	view := NewNodeView(csiNodeLister(t, cn), nil)
	_, err := view.Decision("node-1", "kubernetes.io/aws-ebs")
	var pending interface{ PendingSince() time.Time }
	if !errors.As(err, &pending) || !pending.PendingSince().Equal(created.Time) {
		t.Errorf("error %v: want one pending since the CSINode's creation, %v", err, created)
	}
}
