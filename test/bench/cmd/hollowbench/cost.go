package main

import (
	"context"
	"strings"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// cost is what a set of processes used over a period, per member (a
// hollow node, or the controller).
type cost struct {
	period   time.Duration
	cores    float64 // CPU seconds per second, per member
	rssMiB   float64 // RSS at the end, per member
	peakMiB  float64 // the largest peak RSS (VmHWM) among the processes
	kubelet  float64 // of rssMiB, the kubelets'
	members  int
	cpuTotal float64 // CPU seconds, all members
}

// sample reads every process's stats, in order.
func sample(procs []*stack.Process) ([]framework.Stats, error) {
	out := make([]framework.Stats, len(procs))
	for i, p := range procs {
		s, err := p.Stats()
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// measure samples procs, waits d, samples again: the nodes at rest.
func measure(ctx context.Context, procs []*stack.Process, d time.Duration) (cost, error) {
	before, err := sample(procs)
	if err != nil {
		return cost{}, err
	}
	select {
	case <-ctx.Done():
		return cost{}, ctx.Err()
	case <-time.After(d):
	}
	after, err := sample(procs)
	if err != nil {
		return cost{}, err
	}
	c := costOf(before, after, countKubelets(procs))
	for i, p := range procs {
		if isKubelet(p) {
			c.kubelet += float64(after[i].RSSKiB) / 1024 / float64(c.members)
		}
	}
	return c, nil
}

func isKubelet(p *stack.Process) bool {
	return strings.HasPrefix(p.Name, stack.HollowNodeBinary)
}

func countKubelets(procs []*stack.Process) int {
	n := 0
	for _, p := range procs {
		if isKubelet(p) {
			n++
		}
	}
	return n
}

// costOf is the cost between two samples of the same processes, divided
// among members.
func costOf(before, after []framework.Stats, members int) cost {
	c := cost{members: members}
	if len(after) == 0 || members == 0 {
		return c
	}
	c.period = after[0].At.Sub(before[0].At)
	var ticks, rss int64
	for i := range after {
		ticks += after[i].CPUTicks - before[i].CPUTicks
		rss += after[i].RSSKiB
		c.peakMiB = max(c.peakMiB, float64(after[i].HWMKiB)/1024)
	}
	c.cpuTotal = framework.CPUSeconds(ticks)
	c.cores = c.cpuTotal / c.period.Seconds() / float64(members)
	c.rssMiB = float64(rss) / 1024 / float64(members)
	return c
}
