package bench

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"
)

// Milestones of the stream phase, from the first pod deletion of each
// teardown.
const (
	MTeardownAlone  = "teardown alone"        // every VolumeAttachment of the set gone, nothing else under way
	MTeardownStream = "teardown under stream" // the same, new pods arriving meanwhile
)

// WaitStream names, in PhaseResult.Waits, the waits of the pods the stream
// created during the teardown: each from its creation until its volume is
// listed in its node's status.
const WaitStream = "stream"

// StreamTarget is the most the teardown under the stream may take, as a
// multiple of the same teardown alone: a steady stream of new pods
// (whose attaches go first) must not hold back the detaches for long.
const StreamTarget = 1.2

// stream measures the teardown of StreamTeardown volumes (their pods
// deleted at once, spread over the nodes) twice in the same run: alone,
// then while new pods, each with a volume of its own, are created at
// StreamRate a second from the first deletion on. Each teardown runs from
// the first deletion until every VolumeAttachment of the set is gone. The
// stream's volumes (claims and PVs) are made beforehand, enough for three
// times the first teardown and ten seconds more; the stream stops once the
// teardown is done, or when they run out (the report counts its pods).
// Then the stream's pods are deleted and their volumes detached.
func (r *runner) stream(ctx context.Context, p *PhaseResult) error {
	cfg, w, client, obs := r.cfg, r.w, r.env.Client, r.env.Observer
	set := teardownBatch(cfg.StreamTeardown)
	all := set.First(set.Size)
	f := cfg.Floors()
	timeout := cfg.timeout(f.Teardown(set.Size, min(set.Size, w.Nodes)))
	if err := w.CreateBatchVolumes(ctx, client, set); err != nil {
		return err
	}
	// attach creates round's pods of the set and waits until their volumes
	// are attached and listed, and the controller is quiet.
	attach := func(round int) error {
		if err := w.CreateBatchPods(ctx, client, set, all, round); err != nil {
			return err
		}
		e := w.Expect(w.All())
		w.addBatch(e, set, all)
		if _, err := obs.Await(ctx, e, time.Now(), timeout, milestoneDone); err != nil {
			return fmt.Errorf("volumes to tear down not attached: %w", err)
		}
		_, err := r.settle(ctx, time.Now())
		return err
	}

	// Alone.
	if err := attach(1); err != nil {
		return err
	}
	start := time.Now()
	if err := w.DeleteBatchPods(ctx, client, set, all, 1); err != nil {
		return err
	}
	t, err := obs.Await(ctx, w.Expect(w.All()), start, timeout, milestoneGone)
	if err != nil {
		return fmt.Errorf("teardown alone: %w", err)
	}
	alone := t[MGone]
	p.Times[MTeardownAlone] = alone
	if _, err := r.settle(ctx, start); err != nil {
		return err
	}

	// Under the stream.
	streamed := streamBatch(int(math.Ceil(cfg.StreamRate * (3*alone + 10*time.Second).Seconds())))
	if err := w.CreateBatchVolumes(ctx, client, streamed); err != nil {
		return err
	}
	if err := attach(2); err != nil {
		return err
	}
	listings := make([]Listing, streamed.Size)
	for i := range listings {
		listings[i] = w.batchListing(streamed, i)
	}
	// The stream's VolumeAttachments are no extra: the teardown is done
	// once the set's are gone, whatever the stream's have reached.
	e := w.Expect(w.All())
	w.addBatch(e, streamed, streamed.First(streamed.Size))
	stopWatch := obs.WatchListed(ctx, listings)
	defer stopWatch()

	start = time.Now()
	stop := make(chan struct{})
	stopStream := sync.OnceFunc(func() { close(stop) })
	defer stopStream()
	type streamResult struct {
		created []time.Time
		err     error
	}
	streamDone := make(chan streamResult, 1)
	go func() {
		created, err := r.runStream(ctx, stop, streamed, start)
		streamDone <- streamResult{created, err}
	}()
	err = w.DeleteBatchPods(ctx, client, set, all, 2)
	if err == nil {
		t, err = obs.Await(ctx, e, start, timeout, milestoneGone)
	}
	stopStream()
	sr := <-streamDone
	if err != nil {
		return fmt.Errorf("teardown under the stream: %w", err)
	}
	if sr.err != nil {
		return sr.err
	}
	p.Times[MTeardownStream] = t[MGone]

	// Every pod the stream created gets its volume: its wait is measured.
	created := streamed.First(len(sr.created))
	e = w.Expect(w.All())
	w.addBatch(e, streamed, created)
	if _, err := obs.Await(ctx, e, start, cfg.timeout(f.BurstStatus(len(created), min(len(created), w.Nodes))), milestoneDone); err != nil {
		return fmt.Errorf("volumes of the stream's pods not attached: %w", err)
	}
	seen := stopWatch()
	for i, at := range sr.created {
		p.addWait(WaitStream, seen[i].Sub(at))
	}
	r.logger.Info("Teardown under a stream of new pods done", "volumes", set.Size, "alone", alone.Round(time.Millisecond),
		"underStream", t[MGone].Round(time.Millisecond), "streamPods", len(created), "streamVolumes", streamed.Size)
	return r.removeBatch(ctx, streamed, created, 0)
}

// runStream creates b's pods one after the other, the i-th at start +
// i/StreamRate (at once when late), until stop is closed or b has no
// volume left. It returns when it created each pod (the request sent). A
// create under way when stop closes is finished: every pod made is
// returned, and so waited for and removed.
func (r *runner) runStream(ctx context.Context, stop <-chan struct{}, b Batch, start time.Time) ([]time.Time, error) {
	every := time.Duration(float64(time.Second) / r.cfg.StreamRate)
	var created []time.Time
	for i := range b.Size {
		t := time.NewTimer(time.Until(start.Add(time.Duration(i) * every)))
		select {
		case <-stop:
			t.Stop()
			return created, nil // the teardown is done
		case <-t.C:
		}
		at := time.Now()
		if err := r.w.CreateBatchPod(ctx, r.env.Client, b, i, 0); err != nil {
			return created, err
		}
		created = append(created, at)
	}
	r.logger.Info("The stream ran out of volumes before the teardown was done", "pods", b.Size)
	return created, nil
}
