package sim

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// thirdParty makes one write of someone other than the controller, the
// workload and the attachers: an admin unsticking an attachment, or
// kube-controller-manager's attach/detach controller during a cut-over,
// which deletes and creates VolumeAttachments and patches
// node.status.volumesAttached as it sees them; or a tool that writes a
// Node without the managed annotation, put back a few steps later.
func (s *Sim) thirdParty() {
	switch x := s.rng.Float64(); {
	case x < 0.35:
		s.thirdPartyDelete()
	case x < 0.5:
		s.thirdPartyCreate()
	case x < 0.75:
		s.thirdPartyPatchStatus()
	default:
		s.flap()
	}
}

// thirdPartyDelete deletes a VolumeAttachment.
func (s *Sim) thirdPartyDelete() {
	var all []*storagev1.VolumeAttachment
	for _, va := range s.w.attachments() {
		if va.DeletionTimestamp == nil {
			all = append(all, va)
		}
	}
	if len(all) > 0 {
		s.deleteAttachmentAsThirdParty(all[s.rng.Intn(len(all))])
	}
}

// stuck returns the VolumeAttachments an admin deletes to unstick a pod: its
// attach failed while a pod on another node waits for its single-node
// volume (Multi-Attach).
func (s *Sim) stuck() []*storagev1.VolumeAttachment {
	var out []*storagev1.VolumeAttachment
	var wanted map[pair]bool
	for _, va := range s.w.attachments() {
		v := s.volumeByPV(attachmentVolume(va))
		if va.DeletionTimestamp != nil || va.Status.AttachError == nil || v == nil || !v.singleNode {
			continue
		}
		if wanted == nil {
			wanted = s.wanted()
		}
		if slices.ContainsFunc(s.nodeNames(), func(n string) bool { return n != va.Spec.NodeName && wanted[pair{v.pv, n}] }) {
			out = append(out, va)
		}
	}
	return out
}

func (s *Sim) unstick() {
	st := s.stuck()
	s.stats["fault: third party deleted a VolumeAttachment with an attach error, its volume wanted elsewhere"]++
	s.deleteAttachmentAsThirdParty(st[s.rng.Intn(len(st))])
}

func (s *Sim) deleteAttachmentAsThirdParty(va *storagev1.VolumeAttachment) {
	s.stats["fault: third party deleted a VolumeAttachment"]++
	s.tracef("third party: delete VolumeAttachment %s (%s on %s)", va.Name, attachmentVolume(va), va.Spec.NodeName)
	s.thirdPartyVA[va.Name] = true
	s.w.deleteObject(rAttachments, va.Name)
}

// thirdPartyCreate creates the VolumeAttachment of a volume that may attach
// to many nodes. (Creating one of a single-node volume would race the
// controller, which may be attaching it elsewhere: no one can prevent that.)
func (s *Sim) thirdPartyCreate() {
	var multi []simVolume
	for _, v := range s.vols {
		if !v.singleNode && v.source.CSI != nil {
			multi = append(multi, v)
		}
	}
	nodes := s.w.list(rNodes)
	if len(multi) == 0 || len(nodes) == 0 {
		return
	}
	v := multi[s.rng.Intn(len(multi))]
	node := nodes[s.rng.Intn(len(nodes))].GetName()
	if s.w.get(rPVs, v.pv) == nil {
		// It attaches what it reads from a PV.
		return
	}
	name := volume.AttachmentName(v.source.CSI.VolumeHandle, v.source.CSI.Driver, node)
	if s.w.get(rAttachments, name) != nil {
		return
	}
	pv := v.pv
	s.stats["fault: third party created a VolumeAttachment"]++
	s.tracef("third party: create VolumeAttachment %s (%s on %s)", name, pv, node)
	s.thirdPartyVA[name] = true
	s.w.create(rAttachments, &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: v.source.CSI.Driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	})
}

// thirdPartyPatchStatus takes a volume out of a node's
// status.volumesAttached, or puts back one it took out, as
// kube-controller-manager writes the list it believes in. It lists nothing
// the controller did not list last: kubelet would mount what it lists,
// under a detach the controller decided on what it had written. Nor does it
// list again an in-tree volume whose attachment was forgotten with the
// controller's memory since: the iSCSI attacher only records, so listing
// it would attach it again, where nobody knows of it.
func (s *Sim) thirdPartyPatchStatus() {
	nodes := s.w.list(rNodes)
	if len(nodes) == 0 {
		return
	}
	n := nodes[s.rng.Intn(len(nodes))].(*v1.Node).DeepCopy()
	l := n.Status.VolumesAttached
	var removed []string
	for name := range s.thirdPartyRemoved[n.Name] {
		if slices.ContainsFunc(l, func(a v1.AttachedVolume) bool { return string(a.Name) == name }) ||
			(!strings.HasPrefix(name, "kubernetes.io/csi/") && !s.intree[n.Name][name]) {
			continue
		}
		removed = append(removed, name)
	}
	slices.Sort(removed)
	var name string
	switch {
	case len(removed) > 0 && (len(l) == 0 || s.chance(0.5)):
		name = removed[s.rng.Intn(len(removed))]
		n.Status.VolumesAttached = append(slices.Clone(l), v1.AttachedVolume{Name: v1.UniqueVolumeName(name)})
		delete(s.thirdPartyRemoved[n.Name], name)
		s.stats["fault: third party listed again in node status a volume it took out"]++
		s.tracef("third party: %s listed again in node %s status", name, n.Name)
	case len(l) > 0:
		i := s.rng.Intn(len(l))
		name = string(l[i].Name)
		n.Status.VolumesAttached = slices.Delete(slices.Clone(l), i, i+1)
		if s.thirdPartyRemoved[n.Name] == nil {
			s.thirdPartyRemoved[n.Name] = map[string]bool{}
		}
		s.thirdPartyRemoved[n.Name][name] = true
		s.stats["fault: third party took a volume out of node status"]++
		s.tracef("third party: %s taken out of node %s status", name, n.Name)
	default:
		return
	}
	if s.thirdPartyListed[n.Name] == nil {
		s.thirdPartyListed[n.Name] = map[string]bool{}
	}
	s.thirdPartyListed[n.Name][name] = true
	s.w.update(rNodes, n)
}

// flap removes a node's managed annotation; unflap puts it back.
func (s *Sim) flap() {
	var managedNodes []*v1.Node
	for _, o := range s.w.list(rNodes) {
		if n := o.(*v1.Node); n.Annotations[managed] != "" {
			managedNodes = append(managedNodes, n)
		}
	}
	if len(managedNodes) == 0 {
		return
	}
	n := managedNodes[s.rng.Intn(len(managedNodes))].DeepCopy()
	delete(n.Annotations, managed)
	s.stats["fault: third party removed the managed annotation for a while"]++
	s.tracef("third party: node %s managed annotation removed", n.Name)
	s.flapped[n.Name] = true
	s.w.update(rNodes, n)
}

func (s *Sim) unflap() {
	var names []string
	for name := range s.flapped {
		names = append(names, name)
	}
	slices.Sort(names)
	name := names[s.rng.Intn(len(names))]
	delete(s.flapped, name)
	n := s.w.node(name)
	if n == nil || n.Annotations[managed] != "" || s.toldToAttach(name) {
		return
	}
	n = n.DeepCopy()
	n.Annotations = map[string]string{managed: "true"}
	s.tracef("third party: node %s managed annotation back", name)
	s.w.update(rNodes, n)
}

func (s *Sim) nodeNames() []string {
	out := make([]string, s.cfg.Nodes)
	for i := range out {
		out[i] = nodeName(i)
	}
	return out
}
