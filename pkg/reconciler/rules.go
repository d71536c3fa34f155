package reconciler

import (
	"fmt"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// singleNodeAccessConflict enforces "a ReadWriteOnce / ReadWriteOncePod
// volume (or an inline azureDisk / cinder volume) is attached to one node at
// most". It returns where the volume is held on other nodes, under any of its
// names and in any state: an uncertain or detaching attachment may still be
// attached.
func singleNodeAccessConflict(spec *volume.Spec, node string, actual *cache.ActualState) []cache.Key {
	if !spec.SingleNode {
		return nil
	}
	return actual.AttachedElsewhere(append(spec.AllNames(), spec.DiskName()), node)
}

// safeToDetach enforces "never detach a volume mounted on a healthy node",
// with its two exceptions: the node.kubernetes.io/out-of-service taint (at
// once), and an unhealthy node (not Ready, or deleted) once the max wait for
// unmount has passed since the detach was first wanted, unless forced
// detaches on timeout are disabled. A node whose Node object is gone waits
// MaxWaitForUnmountDeletedNode instead, when set.
//
// A node never seen (deleted before the controller started) may have
// anything mounted: it is treated as unhealthy with the volume mounted.
//
// It returns the force reason when a mounted volume may be detached, or a
// non-empty reason to wait, with the time after which to look again (zero:
// wait for a change of the node).
func safeToDetach(k cache.Key, node cache.NodeInfo, wanted, now time.Time, cfg Config) (force string, after time.Duration, wait string) {
	if !node.Mounted(k.Volume) {
		return "", 0, ""
	}
	if node.OutOfService {
		return ForceOutOfService, 0, ""
	}
	if node.Healthy() {
		return "", 0, fmt.Sprintf("still mounted on node %s (in node.status.volumesInUse); waiting for kubelet to unmount it", k.Node)
	}
	if cfg.DisableForceDetachOnTimeout {
		return "", 0, fmt.Sprintf("still mounted on unhealthy node %s and forced detach on timeout is disabled", k.Node)
	}
	maxWait := cfg.MaxWaitForUnmount
	if !node.Exists && cfg.MaxWaitForUnmountDeletedNode != nil {
		maxWait = *cfg.MaxWaitForUnmountDeletedNode
	}
	if elapsed := now.Sub(wanted); elapsed < maxWait {
		left := maxWait - elapsed
		return "", left, fmt.Sprintf("still mounted on unhealthy node %s; forced detach in %s unless it is unmounted", k.Node, left.Round(time.Second))
	}
	return ForceTimeout, 0, ""
}
