package cache

import (
	"fmt"
	"slices"
	"strings"

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

// HandOver freezes the record for a handoff: from now on no detach of an
// attached volume starts (BeginDetach refuses) and the node reports list
// again the attached volumes that were withdrawn for a detach that has not
// started. Detaches that began, and those of attaches never confirmed (no
// status lists them), still run. It returns the
// nodes whose report must be written (again): those whose report changes,
// and those with a write in flight, which may have been computed before the
// freeze.
func (a *ActualState) HandOver() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.handingOver = true
	return a.toWriteLocked()
}

// HandingOver reports whether a handoff began (HandOver).
func (a *ActualState) HandingOver() bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.handingOver
}

// toWriteLocked lists the nodes, sorted, whose report differs from what the
// controller last wrote, or is being written.
func (a *ActualState) toWriteLocked() []string {
	var nodes []string
	for name, n := range a.nodes {
		if !n.info.Exists {
			continue
		}
		if n.writing || n.dirty {
			nodes = append(nodes, name)
			continue
		}
		for _, at := range n.attachments {
			if reportLocked(at, a.handingOver) != at.Reported {
				nodes = append(nodes, name)
				break
			}
		}
	}
	slices.Sort(nodes)
	return nodes
}

// Unsettled lists what a successor would find ambiguous (at most limit
// entries, sorted) and how many there are in all: attaches and detaches under
// way, and attached volumes that their node's status does not list yet (or
// whose write is in flight). Volumes of nodes whose Node object is gone are
// left out: no status can list them. toWrite are the nodes whose report must
// still be written, for the caller to make sure a write is queued.
func (a *ActualState) Unsettled(limit int) (count int, sample, toWrite []string) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for name, n := range a.nodes {
		for v, at := range n.attachments {
			var why string
			switch {
			case at.State == Uncertain && at.Kind == volume.KindCSI && at.AttachmentUID == "" && at.AttachStarted.IsZero():
				// Listed in node status at start with no VolumeAttachment
				// (someone deleted it): nothing is under way, and the
				// writes take it out of the status.
				if at.Reported || n.writing || n.dirty {
					why = "node status write under way"
					break
				}
				continue
			case at.State == Uncertain:
				why = "attach under way"
			case at.State == Detaching || !at.DetachStarted.IsZero():
				why = "detach under way"
			case !n.info.Exists:
				continue
			case !at.Reported:
				why = "not yet listed in node status"
			case n.writing || n.dirty:
				why = "node status write under way"
			default:
				continue
			}
			count++
			sample = append(sample, fmt.Sprintf("%s on %s: %s", v, name, why))
		}
	}
	slices.SortFunc(sample, strings.Compare)
	if len(sample) > limit {
		sample = sample[:limit]
	}
	return count, sample, a.toWriteLocked()
}
