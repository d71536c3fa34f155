// Package intree holds the in-tree attacher plugins: the volumes the
// controller attaches itself instead of through a CSI VolumeAttachment. It
// is modelled on Kubernetes' volume.AttachableVolumePlugin, Attacher and
// Detacher, cut down to what the controller calls.
//
// The cloud disk plugins (aws-ebs, gce-pd, azure-disk, cinder,
// vsphere-volume, portworx-volume) are not here: their in-tree code is gone
// upstream and their volumes are attached through CSI migration. What
// remains, iSCSI and FC, attaches on the node; the controller only records
// the attachment so that kubelet, which waits for the volume in
// node.status.volumesAttached, goes on to mount it.
package intree

import (
	"context"
	"fmt"
	"sort"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Plugin attaches and detaches the volumes of one in-tree plugin.
type Plugin interface {
	// Name is the in-tree plugin name, e.g. "kubernetes.io/iscsi".
	Name() string
	// Attach attaches the volume to node and returns the device path to
	// report in node.status.volumesAttached (may be empty).
	Attach(ctx context.Context, spec *volume.Spec, node string) (devicePath string, err error)
	// Detach detaches the volume attached under name from node.
	Detach(ctx context.Context, name volume.Name, node string) error
}

// NoAttacherError: no Plugin is registered for an in-tree plugin.
type NoAttacherError struct {
	Plugin string
}

func (e *NoAttacherError) Error() string {
	return fmt.Sprintf("in-tree plugin %s has no attacher in this build: install its CSI driver and migrate the node", e.Plugin)
}

// Registry finds the Plugin of an in-tree plugin name. It is read-only once
// built, so safe for concurrent use.
type Registry struct {
	plugins map[string]Plugin
}

// NewRegistry registers plugins. Two plugins with the same name are a wiring
// bug: NewRegistry panics.
func NewRegistry(plugins ...Plugin) *Registry {
	r := &Registry{plugins: make(map[string]Plugin, len(plugins))}
	for _, p := range plugins {
		if _, dup := r.plugins[p.Name()]; dup {
			panic(fmt.Sprintf("intree: plugin %s registered twice", p.Name()))
		}
		r.plugins[p.Name()] = p
	}
	return r
}

// Builtin is the registry of every in-tree plugin this build carries.
func Builtin() *Registry {
	return NewRegistry(ISCSI{}, FC{})
}

// Get returns the Plugin registered for plugin, or a *NoAttacherError.
func (r *Registry) Get(plugin string) (Plugin, error) {
	if p, ok := r.plugins[plugin]; ok {
		return p, nil
	}
	return nil, &NoAttacherError{Plugin: plugin}
}

// Names lists the registered plugin names, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.plugins))
	for n := range r.plugins {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
