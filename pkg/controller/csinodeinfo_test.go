package controller

import (
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	clienttesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/migration"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The CSINodeInfo lister is handed to the NodeView once the CRD is served
// and its informer synced, and taken back when the CRD goes; each change
// re-queues every pod once, and a failed discovery changes nothing.
func TestNodeInfosFollowTheCRD(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	gv := migration.CSINodeInfoGVR.GroupVersion().String()
	info := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gv, "kind": "CSINodeInfo", "metadata": map[string]any{"name": "node-1"},
		"status": map[string]any{"drivers": []any{
			map[string]any{"name": "ebs.csi.aws.com", "available": true, "volumePluginMechanism": "csi"},
		}},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{migration.CSINodeInfoGVR: "CSINodeInfoList"}, info)
	client := fake.NewClientset()
	disc := client.Discovery().(*fakediscovery.FakeDiscovery)
	view := migration.NewNodeView(storagelisters.NewCSINodeLister(toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, nil)), nil)
	changes := 0
	n := &nodeInfos{discovery: disc, dynamic: dyn, view: view, period: time.Second,
		handler: toolscache.ResourceEventHandlerFuncs{}, changed: func() { changes++ }}
	defer n.stopInformer()

	decide := func() (volume.Kind, string) {
		d, err := view.Decision("node-1", "kubernetes.io/aws-ebs")
		var missing *migration.NodeInfoMissingError
		if errors.As(err, &missing) {
			return "", "waiting for " + strings.Join(missing.Objects, " or ")
		}
		return d.Kind, d.Source
	}
	step := func(name string, wantKind volume.Kind, wantSource string, wantChanges int) {
		t.Helper()
		n.check(ctx, 10*time.Second)
		if kind, source := decide(); kind != wantKind || source != wantSource || changes != wantChanges {
			t.Errorf("%s: decision (%q, %q) after %d changes, want (%q, %q) after %d", name, kind, source, changes, wantKind, wantSource, wantChanges)
		}
	}

	step("CRD not served", "", "waiting for CSINode", 0)
	disc.Resources = []*metav1.APIResourceList{{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "csinodeinfos"}}}}
	step("CRD served", volume.KindCSI, migration.SourceCSINodeInfo, 1)
	step("CRD still served", volume.KindCSI, migration.SourceCSINodeInfo, 1)

	disc.PrependReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("discovery unavailable")
	})
	step("discovery fails", volume.KindCSI, migration.SourceCSINodeInfo, 1)
	disc.ReactionChain = disc.ReactionChain[1:]

	disc.Resources = nil
	step("CRD gone", "", "waiting for CSINode", 2)
	if n.informer != nil {
		t.Errorf("informer still running once the CRD is gone")
	}
	disc.Resources = []*metav1.APIResourceList{{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "csinodeinfos"}}}}
	step("CRD back", volume.KindCSI, migration.SourceCSINodeInfo, 3)
}
