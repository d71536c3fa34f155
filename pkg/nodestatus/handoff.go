package nodestatus

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A graceful stop hands the volumes over to whichever controller runs next:
// another replica, kube-controller-manager after a rollback, or this one
// after an upgrade. What the successor trusts is node.status.volumesAttached:
// kube-controller-manager rebuilds its attached volumes from it and treats a
// VolumeAttachment it does not list as uncertain, which does not hold a
// ReadWriteOnce volume on its node, so it would attach that volume to a
// second node. The handoff therefore leaves every VolumeAttachment either
// attached and listed in its node's status, or gone: it starts no detach,
// lists again what was withdrawn for a detach that has not started, and
// waits for the attaches and detaches under way to finish.

// HandOver freezes the record for a handoff (cache.ActualState.HandOver):
// from now on no detach of an attached volume starts and the node reports
// list again the attached volumes that were withdrawn for a detach that has
// not started. Detaches that began, and those of attaches never confirmed
// (no status lists them), still run. It returns the nodes whose status must
// be written (again): those whose report changes, and those with a write in
// flight, which may have been computed before the freeze.
func (r *Record) HandOver() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.actual.HandOver()
	return r.toWriteLocked()
}

// toWriteLocked lists the nodes, sorted, whose status differs from what the
// controller last wrote, or is being written.
func (r *Record) toWriteLocked() []string {
	var nodes []string
	r.actual.EachNode(func(nr cache.NodeReport) {
		if !nr.Info.Exists {
			return
		}
		n := r.nodes[nr.Name]
		if n != nil && (n.writing || n.dirty) || !sameNames(nr.Want, listedOf(n)) {
			nodes = append(nodes, nr.Name)
		}
	})
	slices.Sort(nodes)
	return nodes
}

func listedOf(n *report) map[volume.Name]string {
	if n == nil {
		return nil
	}
	return n.listed
}

// Unsettled lists what a successor would find ambiguous (at most limit
// entries, sorted) and how many there are in all: attaches and detaches under
// way, and attached volumes that their node's status does not list yet (or
// whose write is in flight). Volumes of nodes whose Node object is gone are
// left out: no status can list them. toWrite are the nodes whose status must
// still be written, for the caller to make sure a write is queued.
func (r *Record) Unsettled(limit int) (count int, sample, toWrite []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.actual.EachNode(func(nr cache.NodeReport) {
		n := r.nodes[nr.Name]
		writing := n != nil && (n.writing || n.dirty)
		listed := listedOf(n)
		for _, at := range nr.Attachments {
			_, reported := listed[at.Volume]
			var why string
			switch {
			case at.State == cache.Uncertain && at.Kind == volume.KindCSI && at.AttachmentUID == "" && at.AttachStarted.IsZero():
				// Listed in node status at start with no VolumeAttachment
				// (someone deleted it): nothing is under way, and the
				// writes take it out of the status.
				if reported || writing {
					why = "node status write under way"
					break
				}
				continue
			case at.State == cache.Uncertain:
				why = "attach under way"
			case at.State == cache.Detaching || !at.DetachStarted.IsZero():
				why = "detach under way"
			case !nr.Info.Exists:
				continue
			case !reported:
				why = "not yet listed in node status"
			case writing:
				why = "node status write under way"
			default:
				continue
			}
			count++
			sample = append(sample, fmt.Sprintf("%s on %s: %s", at.Volume, nr.Name, why))
		}
	})
	slices.SortFunc(sample, strings.Compare)
	if len(sample) > limit {
		sample = sample[:limit]
	}
	return count, sample, r.toWriteLocked()
}
