// Package volume turns what pods ask for (a PV, or a volume inline in the pod)
// into a Spec: the one description of a volume that the caches, the reconciler
// and the attach mechanisms share. It also owns the names other components
// read: the unique volume name kubelet expects in node.status and the name of
// a VolumeAttachment.
package volume

import (
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Name is a unique volume name as kubelet writes it in node.status.volumesInUse
// and reads it from node.status.volumesAttached:
// "kubernetes.io/csi/<driver>^<handle>" or "<in-tree plugin>/<id>".
type Name string

// CSIPluginName is the plugin part of every CSI unique volume name.
const CSIPluginName = "kubernetes.io/csi"

// Kind says which mechanism attaches a volume on a node.
type Kind string

const (
	// KindCSI attaches through a VolumeAttachment acted on by the CSI external-attacher.
	KindCSI Kind = "csi"
	// KindInTree attaches through an in-tree attacher plugin.
	KindInTree Kind = "in-tree"
)

// Spec is everything needed to attach one volume to one node.
type Spec struct {
	// Name is the unique name the volume is attached under on this node.
	Name Name
	// Aliases are the other names the same volume can be attached under:
	// for a migratable in-tree volume, the in-tree name and the CSI name
	// (whichever Name is not). Empty otherwise.
	Aliases []Name
	// Kind is the mechanism that attaches it on this node. Empty while Pending.
	Kind Kind
	// PluginName is the in-tree plugin ("kubernetes.io/aws-ebs") for an in-tree
	// or migrated volume, CSIPluginName for a native CSI volume.
	PluginName string
	// Migrated is true for an in-tree volume attached through its CSI driver.
	Migrated bool
	// Driver and VolumeHandle identify a CSI (or migrated) volume.
	Driver       string
	VolumeHandle string
	// PVName is the PersistentVolume's name; empty for an inline volume.
	PVName string
	// InlineSpec is the translated CSI PV spec of a migrated inline volume,
	// carried in VolumeAttachment.spec.source.inlineVolumeSpec.
	InlineSpec *v1.PersistentVolumeSpec
	// PV or Inline is the original source (exactly one is set); in-tree
	// attachers read it.
	PV     *v1.PersistentVolume
	Inline *v1.Volume
	// SingleNode is true when the volume may be attached to one node at most:
	// ReadWriteOnce / ReadWriteOncePod, or an inline azureDisk / cinder volume.
	SingleNode bool
	ReadOnly   bool
	// Pending, when not empty, says why the mechanism can't be decided on this
	// node yet (it names the missing object). Name is then the in-tree name and
	// Aliases holds the CSI name; nothing may be attached until it is decided.
	Pending string
	// PendingSince is when what Pending says began, when the node's
	// objects tell (a driver not registered yet: since its kubelet created
	// the CSINode); zero otherwise.
	PendingSince time.Time
}

// AllNames returns Name followed by Aliases.
func (s *Spec) AllNames() []Name {
	return append([]Name{s.Name}, s.Aliases...)
}

// DiskName names the volume itself, whatever name it is attached under and
// however its source spells it: the CSI name of a CSI or migratable
// volume (its in-tree names differ with the spelling of its ID), else its
// one name.
func (s *Spec) DiskName() Name {
	if s.Driver != "" && s.VolumeHandle != "" {
		return CSIName(s.Driver, s.VolumeHandle)
	}
	return s.Name
}

// OtherNames returns the names of the volume other than name: its names on
// other nodes and under other spellings (AllNames and DiskName).
func (s *Spec) OtherNames(name Name) []Name {
	var out []Name
	for _, n := range append(s.AllNames(), s.DiskName()) {
		if n != name && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}
