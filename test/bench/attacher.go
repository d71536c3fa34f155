package bench

import (
	"context"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// attacherWorkers keep the test attacher ahead of the controller. Each
// VolumeAttachment takes two patches in turn: at 50 ms a patch (a busy
// 2-core apiserver with 100,000 volumes), 16 workers marked at most about
// 150 attached a second, less than a controller allowed 200 requests a
// second creates. A worker also waits out the attach delay: at 300 ms, 64
// workers attached about 200 a second, as many as the controller creates:
// a burst of 1,000 queued in the attacher for seconds, and a move's attach
// and detach with it, which measured the attacher's queue, not the
// controller. 256 attach about 800 a second.
const attacherWorkers = 256

// Attacher stands in for the CSI external-attacher of one driver, as the
// controllers see it (framework.Attacher with its finalizer): it adds its
// finalizer and the node-id annotation, then, after the attach delay (none
// unless set), sets status.attached; on deletion it removes its finalizer
// (the detach succeeds at once). Its client is not throttled.
type Attacher struct {
	done  chan error
	delay atomic.Int64
}

// StartAttacher runs an Attacher until ctx is cancelled; Wait waits for it.
func StartAttacher(ctx context.Context, client kubernetes.Interface, driver string) (*Attacher, error) {
	a := &Attacher{done: make(chan error, 1)}
	fa := framework.NewAttacher(client, framework.AttacherOptions{
		Drivers: []string{driver}, Finalizer: true, Workers: attacherWorkers,
		AttachDelay: func() time.Duration { return time.Duration(a.delay.Load()) },
	})
	go func() { a.done <- fa.Run(ctx) }()
	return a, nil
}

// SetAttachDelay sets how long each attach from now on takes (a phase that
// measures a move with a driver's attach time in it).
func (a *Attacher) SetAttachDelay(d time.Duration) { a.delay.Store(int64(d)) }

// Wait returns once the attacher has stopped, with the error that stopped
// it, if any.
func (a *Attacher) Wait() error { return <-a.done }
