package mechanism

import (
	"context"
	"fmt"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// InTree attaches through the in-tree attacher plugin of the volume's
// plugin. Its attaches complete synchronously.
type InTree struct {
	plugins *intree.Registry
}

var _ reconciler.Mechanism = (*InTree)(nil)

// NewInTree returns the in-tree mechanism over plugins.
func NewInTree(plugins *intree.Registry) *InTree {
	return &InTree{plugins: plugins}
}

// Attach asks the plugin to attach; a plugin not compiled in is an error
// that names it, retried with backoff.
func (m *InTree) Attach(ctx context.Context, spec *volume.Spec, node string) (reconciler.AttachResult, error) {
	p, err := m.plugins.Get(spec.PluginName)
	if err != nil {
		return reconciler.AttachResult{}, &reconciler.NotAttachedError{Err: fmt.Errorf("node %s: %w", node, err)}
	}
	devicePath, err := p.Attach(ctx, spec, node)
	if err != nil {
		return reconciler.AttachResult{}, err
	}
	return reconciler.AttachResult{Attached: true, DevicePath: devicePath}, nil
}

// Detach asks the plugin that attached the volume to detach it.
func (m *InTree) Detach(ctx context.Context, a cache.Attachment) (bool, error) {
	plugin := a.PluginName
	if plugin == "" {
		plugin, _, _ = volume.Parse(a.Volume)
	}
	p, err := m.plugins.Get(plugin)
	if err != nil {
		return false, err
	}
	if err := p.Detach(ctx, a.Volume, a.Node); err != nil {
		return false, err
	}
	return true, nil
}

// Settle attaches the volume again after a detach of unknown outcome, for a
// pod that wants it again on the same node: no API shows what became of an
// in-tree detach, and an attach (idempotent) leaves the volume attached,
// whatever the detach did. The plugins of this build only record the
// attachment; kubelet attaches on the node.
func (m *InTree) Settle(ctx context.Context, a cache.Attachment, spec *volume.Spec) (reconciler.Settled, error) {
	if spec == nil {
		spec = a.Spec
	}
	if spec == nil {
		return reconciler.Settled{}, fmt.Errorf("volume %s: no spec to attach it again with", a.Volume)
	}
	res, err := m.Attach(ctx, spec, a.Node)
	if err != nil {
		return reconciler.Settled{}, err
	}
	return reconciler.Settled{Attached: true, DevicePath: res.DevicePath}, nil
}
