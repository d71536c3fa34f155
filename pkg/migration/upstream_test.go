package migration

import (
	"slices"
	"testing"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// upstreamV1372 is what kube-controller-manager v1.37.2 answers for each
// in-tree plugin, in kubernetes/kubernetes
// pkg/volume/csimigration/plugin_manager.go: IsMigrationEnabledForPlugin
// (what IsMigratable says of the plugin's volumes) and
// IsMigrationCompleteForPlugin. No feature gate is left to change them:
// since v1.36 (kubernetes/kubernetes#135322, which removed
// CSIMigrationPortworx and InTreePluginPortworxUnregister) Portworx is
// migrated and complete like the others; every other plugin (iSCSI, FC,
// RBD, whose in-tree code is gone) falls to the default case: neither.
var upstreamV1372 = []upstreamAnswer{
	{"kubernetes.io/aws-ebs", true, true},
	{"kubernetes.io/gce-pd", true, true},
	{"kubernetes.io/azure-disk", true, true},
	{"kubernetes.io/azure-file", true, true},
	{"kubernetes.io/cinder", true, true},
	{"kubernetes.io/vsphere-volume", true, true},
	{"kubernetes.io/portworx-volume", true, true},
	{"kubernetes.io/iscsi", false, false},
	{"kubernetes.io/fc", false, false},
	{"kubernetes.io/rbd", false, false},
}

type upstreamAnswer struct {
	plugin               string
	migratable, complete bool
}

// --csi-migration=completed is kube-controller-manager v1.37.2's rule: the
// plugins its plugin manager says are complete are CSI on every node
// without reading CSINode, and only those.
func TestCompletedPolicyIsUpstreams(t *testing.T) {
	completed, err := CompletedMigrations(PolicyCompleted)
	if err != nil {
		t.Fatal(err)
	}
	// No CSINode anywhere: only a completed plugin is decided.
	view := NewNodeView(csiNodeLister(t), nil, WithCompletedMigrations(completed...))
	for _, u := range upstreamV1372 {
		t.Run(u.plugin, func(t *testing.T) {
			p, known := volume.InTreePluginByName(u.plugin)
			if got := known && p.Migratable(); got != u.migratable {
				t.Errorf("migratable: %v, upstream says %v", got, u.migratable)
			}
			if got := slices.Contains(completed, u.plugin); got != u.complete {
				t.Errorf("complete under --csi-migration=completed: %v, upstream says %v (completed: %v)", got, u.complete, completed)
			}
			d, err := view.Decision(node, u.plugin)
			if complete := d.Source == SourceMigrationComplete; complete != u.complete || (u.complete && (err != nil || d.Kind != volume.KindCSI)) {
				t.Errorf("decision on a node without CSINode: (%+v, %v), upstream's migration complete: %v", d, err, u.complete)
			}
		})
	}
	for _, p := range volume.InTreePlugins() {
		if !slices.ContainsFunc(upstreamV1372, func(u upstreamAnswer) bool { return u.plugin == p.Name }) {
			t.Errorf("in-tree plugin %s missing from upstream's table here", p.Name)
		}
	}
}
