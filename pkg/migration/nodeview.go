// Package migration decides, per node, whether the volumes of a migratable
// in-tree plugin (kubernetes.io/aws-ebs, ...) are attached through the
// plugin's CSI driver or the in-tree way.
//
// The answer comes from what the node's kubelet reports:
//
//   - CSINode (storage.k8s.io/v1): the annotation
//     storage.alpha.kubernetes.io/migrated-plugins lists the migrated plugins
//     and spec.drivers the registered CSI drivers. kubelet rewrites it at
//     every start, so it wins whenever it carries that annotation.
//   - CSINodeInfo (csi.storage.k8s.io/v1alpha1, a CRD of old clusters):
//     status.drivers[] says per driver whether it is available and which
//     mechanism handles the plugin's volumes. Read when there is no CSINode,
//     or a CSINode without the annotation: that one says nothing about
//     migration. The CRD may be installed, or removed, while the controller
//     runs (SetCSINodeInfos).
//   - A CSINode without the annotation and no CSINodeInfo: in-tree, as a
//     kubelet without CSI migration reports.
//
// With neither, the answer is not "in-tree" but "not yet": a
// NodeInfoMissingError, so that nothing is attached (or detached) under a
// name the node may not use.
package migration

import (
	"fmt"
	"strings"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Where a Decision comes from.
const (
	// SourceNone: the plugin is never migrated; nothing was looked up.
	SourceNone = ""
	// SourceCSINode: the node's CSINode.
	SourceCSINode = "CSINode"
	// SourceCSINodeInfo: the node's CSINodeInfo (no CSINode, or one without
	// the migrated-plugins annotation).
	SourceCSINodeInfo = "CSINodeInfo"
	// SourceMigrationComplete: the plugin was configured as migrated
	// everywhere (WithCompletedMigrations); nothing was looked up.
	SourceMigrationComplete = "MigrationComplete"
)

// Decision is how one node handles one in-tree plugin's volumes, and why.
type Decision struct {
	// Kind is empty when the decision failed.
	Kind volume.Kind
	// Driver is the CSI driver replacing the plugin; empty if it has none.
	Driver string
	// Source is the object (or rule) the decision was read from.
	Source string
}

// Origin says, for a reader, the object or rule the decision for node was
// read from.
func (d Decision) Origin(node string) string {
	switch d.Source {
	case SourceCSINode:
		return "CSINode " + node + " (annotation " + v1.MigratedPluginsAnnotationKey + ", spec.drivers)"
	case SourceCSINodeInfo:
		return "CSINodeInfo " + node + " (status.drivers)"
	case SourceMigrationComplete:
		return "completed-migration policy: migrated on every node"
	default:
		return "never migrated: the plugin has no CSI driver"
	}
}

// NodeView answers, from informer caches, which mechanism each node uses for
// each in-tree plugin. It is safe for concurrent use.
type NodeView struct {
	csiNodes     storagelisters.CSINodeLister
	csiNodeInfos atomic.Pointer[cache.GenericLister]
	completed    map[string]bool
}

// Option configures a NodeView.
type Option func(*NodeView)

// WithCompletedMigrations makes plugins always handled through CSI, on every
// node, without looking at CSINode or CSINodeInfo. kube-controller-manager
// does so for the plugins whose in-tree code is gone (see
// UpstreamCompletedMigrations).
func WithCompletedMigrations(plugins ...string) Option {
	return func(v *NodeView) {
		for _, p := range plugins {
			v.completed[p] = true
		}
	}
}

// Policies of the controller's --csi-migration flag: who decides whether an
// in-tree volume is attached through its CSI driver.
const (
	// PolicyPerNode: each node's CSINode (or CSINodeInfo) decides, for every
	// plugin; a node that has said nothing yet makes its volumes wait.
	PolicyPerNode = "per-node"
	// PolicyCompleted: as kube-controller-manager v1.37, the plugins whose
	// migration upstream declares complete (all of them) are CSI on every
	// node, without reading CSINode.
	PolicyCompleted = "completed"
)

// Policies lists the valid policies, the default first.
func Policies() []string { return []string{PolicyPerNode, PolicyCompleted} }

// CompletedMigrations returns the plugins policy treats as migrated on
// every node, for WithCompletedMigrations.
func CompletedMigrations(policy string) ([]string, error) {
	switch policy {
	case PolicyPerNode:
		return nil, nil
	case PolicyCompleted:
		return UpstreamCompletedMigrations(), nil
	default:
		return nil, fmt.Errorf("unknown CSI migration policy %q: want one of %s", policy, strings.Join(Policies(), ", "))
	}
}

// UpstreamCompletedMigrations lists the plugins kube-controller-manager v1.37
// treats as migrated on every node (its csimigration.PluginManager
// IsMigrationCompleteForPlugin with default feature gates): every plugin
// that migrates, Portworx too since v1.37 removed its feature gate.
func UpstreamCompletedMigrations() []string {
	var plugins []string
	for _, p := range volume.InTreePlugins() {
		if p.MigrationCompleteUpstream {
			plugins = append(plugins, p.Name)
		}
	}
	return plugins
}

// NewNodeView reads CSINodes from csiNodes and, when csiNodeInfos is not nil
// (the CSINodeInfo CRD is installed), CSINodeInfo objects as unstructured
// objects from a dynamic informer's lister.
func NewNodeView(csiNodes storagelisters.CSINodeLister, csiNodeInfos cache.GenericLister, opts ...Option) *NodeView {
	v := &NodeView{
		csiNodes:  csiNodes,
		completed: map[string]bool{},
	}
	v.SetCSINodeInfos(csiNodeInfos)
	for _, o := range opts {
		o(v)
	}
	return v
}

// SetCSINodeInfos changes where CSINodeInfo objects are read from: a lister
// once the CRD is served and its informer synced, nil once it is gone. The
// caller re-queues what the change may decide differently.
func (v *NodeView) SetCSINodeInfos(csiNodeInfos cache.GenericLister) {
	if csiNodeInfos == nil {
		v.csiNodeInfos.Store(nil)
		return
	}
	v.csiNodeInfos.Store(&csiNodeInfos)
}

var _ volume.Decider = (*NodeView)(nil).Decide

// Decide is a volume.Decider: the Kind of Decision.
func (v *NodeView) Decide(node, inTreePlugin string) (volume.Kind, error) {
	d, err := v.Decision(node, inTreePlugin)
	return d.Kind, err
}

// Decision tells how node handles the volumes of plugin. On error the
// Decision still carries Driver and Source when they are known.
func (v *NodeView) Decision(node, plugin string) (Decision, error) {
	p, ok := volume.InTreePluginByName(plugin)
	if !ok || !p.Migratable() {
		return Decision{Kind: volume.KindInTree, Source: SourceNone}, nil
	}
	driver := p.CSIDriver
	if v.completed[plugin] {
		return Decision{Kind: volume.KindCSI, Driver: driver, Source: SourceMigrationComplete}, nil
	}

	// A CSINode without the migrated-plugins annotation says nothing about
	// migration: a CSINodeInfo, when there is one, decides.
	var silent *storagev1.CSINode
	if v.csiNodes != nil {
		csiNode, err := v.csiNodes.Get(node)
		switch {
		case err == nil:
			if _, says := csiNode.Annotations[v1.MigratedPluginsAnnotationKey]; says {
				return decideFromCSINode(csiNode, plugin, driver)
			}
			silent = csiNode
		case !apierrors.IsNotFound(err):
			return Decision{Driver: driver, Source: SourceCSINode}, fmt.Errorf("get CSINode %s: %w", node, err)
		}
	}

	objects := []string{SourceCSINode}
	if infos := v.csiNodeInfos.Load(); infos != nil {
		objects = append(objects, SourceCSINodeInfo)
		obj, err := (*infos).Get(node)
		switch {
		case err == nil:
			return decideFromCSINodeInfo(obj, node, driver)
		case !apierrors.IsNotFound(err):
			return Decision{Driver: driver, Source: SourceCSINodeInfo}, fmt.Errorf("get CSINodeInfo %s: %w", node, err)
		}
	}
	if silent != nil {
		return decideFromCSINode(silent, plugin, driver)
	}
	return Decision{Driver: driver}, &NodeInfoMissingError{Node: node, Plugin: plugin, Objects: objects}
}

func decideFromCSINode(csiNode *storagev1.CSINode, plugin, driver string) (Decision, error) {
	d := Decision{Driver: driver, Source: SourceCSINode}
	if !migratedPlugins(csiNode)[plugin] {
		d.Kind = volume.KindInTree
		return d, nil
	}
	for _, installed := range csiNode.Spec.Drivers {
		if installed.Name == driver {
			d.Kind = volume.KindCSI
			return d, nil
		}
	}
	return d, &DriverNotInstalledError{Plugin: plugin, Node: csiNode.Name, Driver: driver, Since: csiNode.CreationTimestamp.Time}
}

func migratedPlugins(csiNode *storagev1.CSINode) map[string]bool {
	set := map[string]bool{}
	for _, p := range strings.Split(csiNode.Annotations[v1.MigratedPluginsAnnotationKey], ",") {
		if p = strings.TrimSpace(p); p != "" {
			set[p] = true
		}
	}
	return set
}

func decideFromCSINodeInfo(obj runtime.Object, node, driver string) (Decision, error) {
	d := Decision{Driver: driver, Source: SourceCSINodeInfo}
	info, err := ParseCSINodeInfo(obj)
	if err != nil {
		return d, err
	}
	status, ok := info.driverStatus(driver)
	if !ok {
		// The driver never registered there: the node still uses in-tree.
		d.Kind = volume.KindInTree
		return d, nil
	}
	switch status.VolumePluginMechanism {
	case MechanismInTree:
		d.Kind = volume.KindInTree
		return d, nil
	case MechanismCSI:
		if !status.Available {
			return d, &DriverNotAvailableError{Driver: driver, Node: node}
		}
		d.Kind = volume.KindCSI
		return d, nil
	default:
		return d, fmt.Errorf("CSINodeInfo %s: driver %s has unknown volumePluginMechanism %q", info.Name, driver, status.VolumePluginMechanism)
	}
}
