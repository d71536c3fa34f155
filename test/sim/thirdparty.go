package sim

import (
	"slices"

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
	case x < 0.4:
		s.thirdPartyDelete()
	case x < 0.55:
		s.thirdPartyCreate()
	case x < 0.85:
		s.thirdPartyPatchStatus()
	default:
		s.flap()
	}
}

// thirdPartyDelete deletes a VolumeAttachment, most often one whose attach
// failed while a pod on another node waits for its single-node volume.
func (s *Sim) thirdPartyDelete() {
	var all, stuck []*storagev1.VolumeAttachment
	wanted := s.wanted()
	for _, va := range s.w.attachments() {
		if va.DeletionTimestamp != nil {
			continue
		}
		all = append(all, va)
		pv := attachmentVolume(va)
		if v := s.volumeByPV(pv); va.Status.AttachError != nil && v != nil && v.singleNode &&
			slices.ContainsFunc(s.nodeNames(), func(n string) bool { return n != va.Spec.NodeName && wanted[pair{pv, n}] }) {
			stuck = append(stuck, va)
		}
	}
	if len(all) == 0 {
		return
	}
	va := all[s.rng.Intn(len(all))]
	if len(stuck) > 0 && s.chance(0.7) {
		va = stuck[s.rng.Intn(len(stuck))]
		s.stats["fault: third party deleted a VolumeAttachment with an attach error, its volume wanted elsewhere"]++
	}
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
// status.volumesAttached, or lists one there.
func (s *Sim) thirdPartyPatchStatus() {
	nodes := s.w.list(rNodes)
	if len(nodes) == 0 {
		return
	}
	n := nodes[s.rng.Intn(len(nodes))].(*v1.Node).DeepCopy()
	var name string
	if l := n.Status.VolumesAttached; len(l) > 0 && s.chance(0.5) {
		i := s.rng.Intn(len(l))
		name = string(l[i].Name)
		n.Status.VolumesAttached = slices.Delete(slices.Clone(l), i, i+1)
		s.stats["fault: third party took a volume out of node status"]++
		s.tracef("third party: %s taken out of node %s status", name, n.Name)
	} else {
		// What it sees attached there: it lists what it would itself.
		var names []string
		for _, va := range s.w.attachments() {
			if va.Spec.NodeName == n.Name && va.Status.Attached {
				names = append(names, s.attachedName(va))
			}
		}
		for x := range s.intree[n.Name] {
			names = append(names, x)
		}
		names = slices.DeleteFunc(names, func(x string) bool {
			return slices.ContainsFunc(l, func(a v1.AttachedVolume) bool { return string(a.Name) == x })
		})
		slices.Sort(names)
		if len(names) == 0 {
			return
		}
		name = names[s.rng.Intn(len(names))]
		n.Status.VolumesAttached = append(slices.Clone(l), v1.AttachedVolume{Name: v1.UniqueVolumeName(name)})
		s.stats["fault: third party listed a volume in node status"]++
		s.tracef("third party: %s listed in node %s status", name, n.Name)
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
	if n == nil || n.Annotations[managed] != "" {
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
