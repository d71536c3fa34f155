package reconciler

import (
	"slices"
	"sync"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// volumeLocks makes the decision to attach a single-node volume and the
// attach itself one step across all of the volume's nodes: two workers
// syncing the volume on two nodes at once would otherwise both find it
// attached nowhere and both attach it. Unrelated volumes never wait on each
// other, and volumes that may attach to many nodes take no lock.
//
// A worker never blocks on another's lock (it would sit idle for the
// holder's API call): the key that finds the volume busy is recorded, and
// the holder's release hands it back to be synced again.
type volumeLocks struct {
	mu   sync.Mutex
	held map[volume.Name][]cache.Key // the keys that found it busy
}

// tryLock takes the lock of name for k, or records k as waiting for it.
func (l *volumeLocks) tryLock(name volume.Name, k cache.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == nil {
		l.held = map[volume.Name][]cache.Key{}
	}
	waiters, busy := l.held[name]
	if busy {
		if !slices.Contains(waiters, k) {
			l.held[name] = append(waiters, k)
		}
		return false
	}
	l.held[name] = nil
	return true
}

// unlock releases name and returns the keys that waited for it.
func (l *volumeLocks) unlock(name volume.Name) []cache.Key {
	l.mu.Lock()
	defer l.mu.Unlock()
	waiters := l.held[name]
	delete(l.held, name)
	return waiters
}

// exclusiveName is the name a decision must hold the volume's lock under
// before it acts, or "" when the decision attaches nothing exclusive. It is
// the same on every node and under every spelling of the volume: the CSI
// name of a CSI or migratable volume (two PVs may spell one EBS disk
// "aws://us-east-1a/vol-1" and "vol-1": two in-tree names, one CSI name),
// else its one name. An attach of a volume not wanted (one finished before
// a handoff) holds it too.
func exclusiveName(d Decision) volume.Name {
	if !(d.Desired || d.Action == Attach) || d.Spec == nil || !d.Spec.SingleNode {
		return ""
	}
	return d.Spec.DiskName()
}
