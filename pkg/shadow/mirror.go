package shadow

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// MirrorReport records node.status.volumesAttached as the other controller
// wrote it in the node status record and the actual state of a controller
// that writes nothing: the cluster's report is then the record of what the
// node has attached. A listed volume counts as listed; an in-tree one is attached (node.status
// is its only record), a CSI one the VolumeAttachments know better (with
// none on record, it is uncertain). It returns the keys that changed, and
// apart the attachments known from node.status alone (no VolumeAttachment)
// that it no longer lists: the other controller took them out to detach
// them. Those are marked Detaching; the caller deletes them once it has
// looked at them.
func MirrorReport(a *cache.ActualState, status *nodestatus.Record, node string, listed []v1.AttachedVolume) (changed, dropped []cache.Key) {
	in := make(map[volume.Name]v1.AttachedVolume, len(listed))
	for _, av := range listed {
		in[volume.Name(av.Name)] = av
	}
	was := map[volume.Name]bool{}
	for _, av := range status.Listed(node) {
		was[volume.Name(av.Name)] = true
	}
	status.Mirror(node, listed)
	for name, av := range in {
		k := cache.Key{Volume: name, Node: node}
		plugin, _, _ := volume.Parse(name)
		if a.Update(k, true, func(at *cache.Attachment) {
			if at.AttachmentName != "" {
				return
			}
			at.PluginName = plugin
			at.DevicePath = av.DevicePath
			at.Kind = volume.KindCSI
			if plugin != volume.CSIPluginName {
				at.Kind = volume.KindInTree
				at.State = cache.Attached
			}
		}) || !was[name] {
			changed = append(changed, k)
		}
	}
	for _, k := range a.KeysOn(node) {
		if _, ok := in[k.Volume]; ok {
			continue
		}
		at, ok := a.Get(k)
		if !ok {
			continue
		}
		if at.AttachmentName == "" {
			a.Update(k, false, func(at *cache.Attachment) { at.State = cache.Detaching })
			dropped = append(dropped, k)
			continue
		}
		if was[k.Volume] {
			changed = append(changed, k)
		}
	}
	return changed, dropped
}
