package cache

import (
	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// MirrorReport records node.status.volumesAttached as another controller
// wrote it, for a controller that writes nothing (shadow mode): the
// cluster's report is then the record of what the node has attached. A
// listed volume counts as reported; an in-tree one is attached (node.status
// is its only record), a CSI one the VolumeAttachments know better (with
// none on record, it is uncertain). It returns the keys that changed, and
// apart the attachments known from node.status alone (no VolumeAttachment)
// that it no longer lists: the other controller took them out to detach
// them. Those are marked Detaching; the caller deletes them once it has
// looked at them.
func (a *ActualState) MirrorReport(node string, listed []v1.AttachedVolume) (changed, dropped []Key) {
	in := make(map[volume.Name]v1.AttachedVolume, len(listed))
	for _, av := range listed {
		in[volume.Name(av.Name)] = av
	}
	for name, av := range in {
		k := Key{Volume: name, Node: node}
		plugin, _, _ := volume.Parse(name)
		if a.Update(k, true, func(at *Attachment) {
			at.Reported = true
			if at.AttachmentName != "" {
				return
			}
			at.PluginName = plugin
			at.DevicePath = av.DevicePath
			at.Kind = volume.KindCSI
			if plugin != volume.CSIPluginName {
				at.Kind = volume.KindInTree
				at.State = Attached
			}
		}) {
			changed = append(changed, k)
		}
	}
	for _, at := range a.onNode(node) {
		if _, ok := in[at.Volume]; ok {
			continue
		}
		if at.AttachmentName == "" {
			a.Update(at.Key, false, func(at *Attachment) {
				at.Reported = false
				at.State = Detaching
			})
			dropped = append(dropped, at.Key)
			continue
		}
		if a.Update(at.Key, false, func(at *Attachment) { at.Reported = false }) {
			changed = append(changed, at.Key)
		}
	}
	return changed, dropped
}

// onNode returns copies of the node's attachments.
func (a *ActualState) onNode(node string) []Attachment {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	if n == nil {
		return nil
	}
	out := make([]Attachment, 0, len(n.attachments))
	for _, at := range n.attachments {
		out = append(out, *at)
	}
	return out
}
