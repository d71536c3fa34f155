package intree

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// ISCSI is the iSCSI plugin. As upstream, the node logs in to the target;
// the controller only records the attachment.
type ISCSI struct{}

var _ Plugin = ISCSI{}

// Name implements Plugin.
func (ISCSI) Name() string { return volume.ISCSIPluginName }

// Attach implements Plugin: nothing to do, no device path.
func (p ISCSI) Attach(ctx context.Context, spec *volume.Spec, node string) (string, error) {
	return recordAttach(ctx, p.Name(), isISCSI, spec, node)
}

// Detach implements Plugin: nothing to do.
func (p ISCSI) Detach(ctx context.Context, name volume.Name, node string) error {
	return recordDetach(ctx, p.Name(), name, node)
}

func isISCSI(s *volume.Spec) bool {
	return (s.PV != nil && s.PV.Spec.ISCSI != nil) || (s.Inline != nil && s.Inline.ISCSI != nil)
}

// FC is the Fibre Channel plugin. As upstream, the node finds the disk; the
// controller only records the attachment.
type FC struct{}

var _ Plugin = FC{}

// Name implements Plugin.
func (FC) Name() string { return volume.FCPluginName }

// Attach implements Plugin: nothing to do, no device path.
func (p FC) Attach(ctx context.Context, spec *volume.Spec, node string) (string, error) {
	return recordAttach(ctx, p.Name(), isFC, spec, node)
}

// Detach implements Plugin: nothing to do.
func (p FC) Detach(ctx context.Context, name volume.Name, node string) error {
	return recordDetach(ctx, p.Name(), name, node)
}

func isFC(s *volume.Spec) bool {
	return (s.PV != nil && s.PV.Spec.FC != nil) || (s.Inline != nil && s.Inline.FC != nil)
}

// The helpers below are shared by the plugins whose attach happens entirely
// on the node.

func checkSpec(plugin string, hasSource func(*volume.Spec) bool, spec *volume.Spec) error {
	switch {
	case spec == nil:
		return fmt.Errorf("%s: no volume spec", plugin)
	case spec.PluginName != plugin || !hasSource(spec):
		return fmt.Errorf("%s: volume %s is not of this plugin (plugin %q)", plugin, spec.Name, spec.PluginName)
	}
	return nil
}

func recordAttach(ctx context.Context, plugin string, hasSource func(*volume.Spec) bool, spec *volume.Spec, node string) (string, error) {
	if err := checkSpec(plugin, hasSource, spec); err != nil {
		return "", err
	}
	klog.FromContext(ctx).V(4).Info("Attach is done by the node; recording it", "plugin", plugin, "volume", spec.Name, "node", node)
	return "", nil
}

func recordDetach(ctx context.Context, plugin string, name volume.Name, node string) error {
	if !strings.HasPrefix(string(name), plugin+"/") {
		return fmt.Errorf("%s: volume %s is not of this plugin", plugin, name)
	}
	klog.FromContext(ctx).V(4).Info("Detach is done by the node; recording it", "plugin", plugin, "volume", name, "node", node)
	return nil
}
