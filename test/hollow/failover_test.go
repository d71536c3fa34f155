package hollow

import (
	"fmt"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// electionFlags make a killed leader's Lease expire in seconds.
var electionFlags = []string{"--leader-elect-lease-duration=6s", "--leader-elect-renew-deadline=4s", "--leader-elect-retry-period=1s"}

// startElected starts a replica of the env's controller with leader
// election on the Lease kube-system/lease.
func (e *env) startElected(lease string) *stack.Process {
	e.t.Helper()
	var p *stack.Process
	var err error
	switch e.kind {
	case thisController:
		var c *stack.Controller
		c, err = st.StartController(e.ctx, append([]string{"--leader-elect=true", "--leader-elect-resource-name=" + lease}, electionFlags...)...)
		if c != nil {
			p = c.Process
		}
	case kcm:
		p, err = st.StartKubeControllerManagerElected(e.ctx, lease, electionFlags...)
	}
	if p != nil {
		e.controllers = append(e.controllers, p)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

// leaseHeld says whether kube-system/lease has a holder.
func (e *env) leaseHeld(lease string) step {
	return step{"Lease " + lease + " held", func() (bool, error) {
		l, err := e.client.CoordinationV1().Leases("kube-system").Get(e.ctx, lease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "", nil
	}}
}

// neverDetached returns a check that fails once a VolumeAttachment of vols
// that was seen attached is detached or being deleted.
func (e *env) neverDetached(vols []csiVolume, nodes []string) func() error {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		for i, v := range vols {
			name := v.vaName(nodes[i])
			va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				if seen[name] {
					return fmt.Errorf("VolumeAttachment %s deleted after it was attached", name)
				}
			case err != nil:
				return err
			case va.Status.Attached && va.DeletionTimestamp == nil:
				seen[name] = true
			case seen[name]:
				return fmt.Errorf("VolumeAttachment %s detached or being deleted after it was attached", name)
			}
		}
		return nil
	}
}

// TestControllerFailover: two replicas with leader election; the leader is
// killed (SIGKILL) while pods start, more pods come while the Lease
// expires, and the standby takes over: nothing attached is ever detached,
// every pod runs.
func TestControllerFailover(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, noController, "failover-"+string(kind), 2)
		e.kind = kind
		lease := e.ns
		start := time.Now()
		leader := e.startElected(lease)
		e.waitSteps("leader started", start, nil, e.leaseHeld(lease))
		e.startElected(lease)

		var vols []csiVolume
		var nodes []string
		var steps []step
		for i := range 6 {
			v := e.createVolume(fmt.Sprintf("data-%d", i))
			vols = append(vols, v)
			nodes = append(nodes, e.node(i%2))
		}
		invariant := e.neverDetached(vols, nodes)
		start = time.Now()
		for i, v := range vols {
			pod := fmt.Sprintf("app-%d", i)
			e.createPod(pod, nodes[i], v.claim)
			steps = append(steps, e.vaAttached(v, nodes[i]), e.listedAttached(v, nodes[i], true), e.podRunning(pod))
			if i == 2 {
				// The leader has attached the first pods' volumes; the
				// next come while its Lease runs out.
				e.waitSteps("first pods created", start, invariant, e.vaAttached(vols[0], nodes[0]), e.vaAttached(vols[2], nodes[2]))
				if err := leader.Kill(); err != nil {
					t.Fatal(err)
				}
			}
		}
		e.waitSteps("leader killed while pods start", start, invariant, steps...)
		e.checkNames()
		e.checkKubeletLogs()
	})
}
