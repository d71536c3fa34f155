package reconciler

import (
	"slices"
	"sync"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// volumeLocks makes the decision to attach a single-node volume and the
// attach itself one step across all of the volume's nodes: two workers
// syncing the volume on two nodes at once would otherwise both find it
// attached nowhere and both attach it. Unrelated volumes never wait on each
// other, and volumes that may attach to many nodes take no lock.
type volumeLocks struct {
	mu   sync.Mutex
	held map[volume.Name]*volumeLock
}

type volumeLock struct {
	sync.Mutex
	refs int
}

func (l *volumeLocks) lock(name volume.Name) {
	l.mu.Lock()
	if l.held == nil {
		l.held = map[volume.Name]*volumeLock{}
	}
	vl := l.held[name]
	if vl == nil {
		vl = &volumeLock{}
		l.held[name] = vl
	}
	vl.refs++
	l.mu.Unlock()
	vl.Lock()
}

func (l *volumeLocks) unlock(name volume.Name) {
	l.mu.Lock()
	vl := l.held[name]
	if vl.refs--; vl.refs == 0 {
		delete(l.held, name)
	}
	l.mu.Unlock()
	vl.Unlock()
}

// exclusiveName is the name a decision must hold the volume's lock under
// before it acts: the smallest of a single-node volume's names (the same
// whichever name a node attaches it under), or "" when the decision attaches
// nothing exclusive.
func exclusiveName(d Decision) volume.Name {
	if !d.Desired || d.Spec == nil || !d.Spec.SingleNode {
		return ""
	}
	return slices.Min(d.Spec.AllNames())
}
