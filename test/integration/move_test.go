package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// A ReadWriteOnce volume that moves to another node while a burst of new
// pods arrives goes first: its old node's withdrawal, its detach, its attach
// on the new node and that node's status write are served before the
// burst's attaches, in the queues and in the API budget, though the burst
// came first. With a budget of 5 requests a second, the burst's 40 attaches
// and their status writes take over 8 s; the move needs 4 requests.
func TestMoveGoesBeforeABurst(t *testing.T) {
	const burst = 40
	e := newEnv(t, "move-burst")
	driver := e.name("csi.test")
	var nodes []string
	for i := range 5 {
		nodes = append(nodes, e.createNode(fmt.Sprintf("node-%d", i), true))
	}
	e.createCSIClaim("moved", driver, "vol-moved", v1.ReadWriteOnce)
	for i := range burst {
		e.createCSIClaim(fmt.Sprintf("burst-%d", i), driver, fmt.Sprintf("vol-burst-%d", i), v1.ReadWriteOnce)
	}
	e.startAttacher(driver, "")
	e.startController(func(o *app.Options) { o.QPS, o.Burst = 5, 1 })

	moved := framework.CSIVolumeName(driver, "vol-moved")
	e.setVolumesInUse(nodes[0], moved)
	e.createPod("old", nodes[0], "moved")
	e.waitAttached(driver, "vol-moved", nodes[0])

	// The burst, all at once, then the move as a StatefulSet makes it: the
	// old pod goes, its kubelet unmounts, the new pod comes.
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.createPod(fmt.Sprintf("burst-%d", i), nodes[1+i%4], fmt.Sprintf("burst-%d", i))
		}()
	}
	wg.Wait()
	e.deletePod("old")
	e.setVolumesInUse(nodes[0])
	unmounted := time.Now()
	e.createPod("new", nodes[1], "moved")
	e.waitAttached(driver, "vol-moved", nodes[1])
	took := time.Since(unmounted)

	listed := 0
	for i := range burst {
		_, ok, err := e.attachedInStatus(nodes[1+i%4], framework.CSIVolumeName(driver, fmt.Sprintf("vol-burst-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			listed++
		}
	}
	t.Logf("the move took %v after the unmount; %d of the burst's %d volumes listed then", took.Round(time.Millisecond), listed, burst)
	if listed > burst/2 {
		t.Errorf("the moved volume was listed on its new node after %d of the burst's %d volumes: it waited behind the burst", listed, burst)
	}
	for i := range burst {
		e.waitAttached(driver, fmt.Sprintf("vol-burst-%d", i), nodes[1+i%4])
	}
}
