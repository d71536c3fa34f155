package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
)

// WaitMove names, in PhaseResult.Waits, the move phase's moved volumes'
// waits: each from its old node's unmount to its new node's status listing
// it.
const WaitMove = "move"

// MoveTarget is what a moved volume should wait at most, beyond the
// attacher's own delay: the wait a pod tolerates for a volume that
// changes nodes, however busy the controller is with other pods.
const MoveTarget = 2 * time.Second

// move moves MoveVolumes of the workload's volumes, each mounted on its
// node (listed in its status.volumesInUse), to the next node as a
// StatefulSet moves a pod: the old pod is deleted, its kubelet unmounts
// the volume (drops it from volumesInUse), and the new pod is created on
// the other node. The moves come right after the harness has created a
// burst of MoveBurst new pods, each with a volume of its own: a controller
// that serves its work in arrival order makes each move wait for the
// whole burst. Every attach of the phase takes AttachDelay.
//
// Measured, per moved volume: from its unmount (the harness's write of
// volumesInUse answered) until its new node's status.volumesAttached
// lists it; from the burst's first pod: until every burst volume and every
// moved one is attached and listed, and the old attachments are gone. The
// burst's pods are then deleted and their volumes detached, so that the
// next phase finds the workload as it was.
func (r *runner) move(ctx context.Context, p *PhaseResult) error {
	cfg, w, client, obs := r.cfg, r.w, r.env.Client, r.env.Observer
	burst := moveBurst(cfg.MoveBurst)
	set := w.MoveSet(cfg.MoveVolumes)
	// Each moved volume's old node, and the moved volumes by old node: its
	// kubelet writes their unmount in one volumesInUse.
	from := make([]int, len(set))
	byNode := map[int][]int{} // old node: indexes in set
	for j, v := range set {
		from[j] = w.node[v]
		byNode[from[j]] = append(byNode[from[j]], j)
	}
	nodes := slices.Sorted(maps.Keys(byNode))
	oldPods := make([]string, len(set))
	for j, v := range set {
		oldPods[j] = w.pod[v]
	}

	// Before the clock: the burst's claims and PVs, the moved volumes
	// mounted, the attacher slowed down; then a quiet controller.
	if err := w.CreateBatchVolumes(ctx, client, burst); err != nil {
		return err
	}
	if err := parallel(ctx, len(nodes), func(ctx context.Context, i int) error {
		var inUse []v1.UniqueVolumeName
		for _, j := range byNode[nodes[i]] {
			inUse = append(inUse, w.UniqueName(w.handle(set[j])))
		}
		return w.SetVolumesInUse(ctx, client, w.NodeName(nodes[i]), inUse)
	}); err != nil {
		return err
	}
	r.setAttachDelay(cfg.AttachDelay)
	defer r.setAttachDelay(0)
	if _, err := r.settle(ctx, time.Now()); err != nil {
		return err
	}

	w.Move(set, cfg.ChurnRounds+1)
	listings := make([]Listing, len(set))
	for j, v := range set {
		listings[j] = w.listing(v)
	}
	all := burst.First(burst.Size)
	exp := w.Expect(w.All())
	w.addBatch(exp, burst, all)
	f := cfg.Floors()
	timeout := cfg.timeout(f.BurstStatus(burst.Size+len(set), min(burst.Size, w.Nodes)+len(nodes)) + cfg.AttachDelay)

	start := time.Now()
	stopWatch := obs.WatchListed(ctx, listings)
	defer stopWatch()
	result, cancelAwait := obs.AwaitAsync(ctx, exp, start, timeout, nil, milestoneDone)
	defer cancelAwait()
	unmounted := make([]time.Time, len(set))
	err := w.CreateBatchPods(ctx, client, burst, all, 0)
	if err == nil {
		p.Times[MPodsWritten] = time.Since(start)
		err = parallel(ctx, len(nodes), func(ctx context.Context, i int) error {
			js := byNode[nodes[i]]
			moved := make([]int, len(js))
			for k, j := range js {
				if err := deletePod(ctx, client, w.Namespace, oldPods[j]); err != nil {
					return err
				}
				moved[k] = set[j]
			}
			if err := w.SetVolumesInUse(ctx, client, w.NodeName(nodes[i]), nil); err != nil {
				return err
			}
			now := time.Now()
			for _, j := range js {
				unmounted[j] = now
			}
			return w.CreatePods(ctx, client, moved)
		})
	}
	if err != nil {
		cancelAwait()
		_, _ = result()
		return err
	}
	times, err := result()
	if err != nil {
		return err
	}
	p.Times[MDone] = times[MDone]
	seen := stopWatch()
	for j, v := range set {
		if seen[j].IsZero() {
			return fmt.Errorf("moved volume %s not seen in node %s's status", w.handle(v), listings[j].Node)
		}
		p.addWait(WaitMove, seen[j].Sub(unmounted[j]))
	}
	moves := make([]string, 0, len(set))
	for _, d := range p.Waits[WaitMove] {
		moves = append(moves, d.Round(time.Millisecond).String())
	}
	r.logger.Info("Moves during a burst done", "moves", moves, "burst", burst.Size,
		"attachDelay", cfg.AttachDelay, "done", times[MDone].Round(time.Millisecond))
	return r.removeBatch(ctx, burst, all, 0)
}

// removeBatch deletes round's pods of b's volumes idx, waits until their
// volumes are detached and no node lists them, and until the controller
// is quiet.
func (r *runner) removeBatch(ctx context.Context, b Batch, idx []int, round int) error {
	r.setAttachDelay(0)
	if err := r.w.DeleteBatchPods(ctx, r.env.Client, b, idx, round); err != nil {
		return err
	}
	f := r.cfg.Floors()
	timeout := r.cfg.timeout(f.Teardown(len(idx), min(len(idx), r.w.Nodes)))
	if _, err := r.env.Observer.Await(ctx, r.w.Expect(r.w.All()), time.Now(), timeout, milestoneDone); err != nil {
		return fmt.Errorf("%s pods deleted, volumes not detached: %w", b.Name, err)
	}
	_, err := r.settle(ctx, time.Now())
	return err
}

// setAttachDelay sets the test attacher's attach delay, if the run has one.
func (r *runner) setAttachDelay(d time.Duration) {
	if r.env.Attacher != nil {
		r.env.Attacher.SetAttachDelay(d)
	}
}
