package hollow

import (
	"fmt"
	"testing"
	"time"
)

// TestRWOPodLifecycle: a pod with a ReadWriteOnce CSI volume runs because
// the real kubelet mounted it, and its deletion unmounts and detaches it.
func TestRWOPodLifecycle(t *testing.T) {
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "rwo", 1)
		node := e.node(0)
		v := e.createVolume("data")

		start := time.Now()
		e.createPod("app", node, v.claim)
		e.waitSteps("pod created", start, nil,
			e.listedInUse(v, node, true),
			e.vaAttached(v, node),
			e.listedAttached(v, node, true),
			e.podRunning("app"),
		)
		e.checkNames()
		e.checkKubeletLogs()

		start = time.Now()
		e.deletePod("app")
		e.waitSteps("pod deleted", start, nil,
			e.podGone("app"),
			e.listedInUse(v, node, false),
			e.listedAttached(v, node, false),
			e.vaGone(v, node),
		)
		e.checkKubeletLogs()
	})
}

// TestRWOMove: a ReadWriteOnce volume moves to a pod on another node; it is
// never attached to both nodes at once.
func TestRWOMove(t *testing.T) {
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "move", 2)
		from, to := e.node(0), e.node(1)
		v := e.createVolume("data")

		start := time.Now()
		e.createPod("first", from, v.claim)
		e.waitSteps("first pod created", start, nil,
			e.vaAttached(v, from),
			e.listedAttached(v, from, true),
			e.podRunning("first"),
		)

		// The second pod is created as the first is deleted, as a
		// rollout of a single-replica workload does.
		start = time.Now()
		e.deletePod("first")
		e.createPod("second", to, v.claim)
		oneNode := func() error {
			a, err := e.attachedOn(v, from)
			if err != nil {
				return err
			}
			b, err := e.attachedOn(v, to)
			if err != nil {
				return err
			}
			if a && b {
				return fmt.Errorf("ReadWriteOnce volume %s attached to %s and %s at once", v.name(), from, to)
			}
			return nil
		}
		e.waitSteps("moved", start, oneNode,
			e.podGone("first"),
			e.listedInUse(v, from, false),
			e.vaGone(v, from),
			e.listedInUse(v, to, true),
			e.vaAttached(v, to),
			e.listedAttached(v, to, true),
			e.podRunning("second"),
		)
		// Until the volume left the first node, the second node's kubelet
		// rightly found it not attached there.
		mark := e.mark()
		delete(mark, from)
		e.waitSteps("settled", time.Now(), oneNode, e.podRunning("second"))
		e.checkNames()
		e.checkKubeletLogsSince(mark)
	})
}
