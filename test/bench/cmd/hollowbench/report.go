package main

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

type report struct {
	opts       options
	started    time.Time
	nodesStart time.Duration
	idle       cost
	runs       []*result
}

// latency is one span of a pod's start, from a to b.
type latency struct {
	name string
	what string
	span func(t podTimes) time.Duration
}

var latencies = []latency{
	{"pod startup", "creation to Running (ClusterLoader2's pod_startup)", func(t podTimes) time.Duration { return t.running.Sub(t.created) }},
	{"to volumesAttached", "creation to the volume listed in the node's volumesAttached (the controller's part)", func(t podTimes) time.Duration { return t.listed.Sub(t.created) }},
	{"to VolumeAttachment attached", "creation to the attacher's status.attached", func(t podTimes) time.Duration { return t.vaAttached.Sub(t.created) }},
	{"attached to listed", "the VolumeAttachment attached to the volume listed in volumesAttached", func(t podTimes) time.Duration { return t.listed.Sub(t.vaAttached) }},
	{"listed to Running", "volumesAttached to Running (the kubelet's part: its status cycle, then the mount)", func(t podTimes) time.Duration { return t.running.Sub(t.listed) }},
	{"detach", "the pod's deletion to its VolumeAttachment gone", func(t podTimes) time.Duration { return t.vaGone.Sub(t.deleted) }},
}

// percentile is the nearest-rank percentile of sorted durations.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func spans(pods []podTimes, f func(podTimes) time.Duration) []time.Duration {
	out := make([]time.Duration, 0, len(pods))
	for _, t := range pods {
		out = append(out, f(t))
	}
	slices.Sort(out)
	return out
}

func sec(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }

func (r *report) markdown() string {
	var b strings.Builder
	o := r.opts
	pods := o.nodes * o.podsPerNode
	fmt.Fprintf(&b, "# Pod startup on hollow nodes, %s\n\n", r.started.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "%d hollow nodes (the kubelet of Kubernetes v1.37.2 with a fake container runtime, one CSI mock driver each), "+
		"%d pods per node, each with its own ReadWriteOnce CSI volume (%d pods), created at %g/s; "+
		"controllers at QPS %g, burst %d, one after the other on the same nodes (%s). "+
		"Machine: %d CPUs, shared. Times are seen by the bench's watches.\n\n",
		o.nodes, o.podsPerNode, pods, o.createQPS, o.qps, o.burst, o.controllers, runtime.NumCPU())
	fmt.Fprintf(&b, "`go run ./test/bench/cmd/hollowbench -nodes %d -pods-per-node %d -controllers %s -qps %g -burst %d -create-qps %g` (`make bench-hollow`)\n\n",
		o.nodes, o.podsPerNode, o.controllers, o.qps, o.burst, o.createQPS)

	b.WriteString("## Pod startup, seconds (p50 / p90 / p99)\n\n| span | " + strings.Join(r.kinds(), " | ") + " |\n|---|" + strings.Repeat("---|", len(r.runs)) + "\n")
	for _, l := range latencies {
		fmt.Fprintf(&b, "| %s: %s |", l.name, l.what)
		for _, run := range r.runs {
			s := spans(run.pods, l.span)
			fmt.Fprintf(&b, " %s / %s / %s |", sec(percentile(s, 50)), sec(percentile(s, 90)), sec(percentile(s, 99)))
		}
		b.WriteString("\n")
	}
	b.WriteString("| last pod Running, from the first create |")
	for _, run := range r.runs {
		fmt.Fprintf(&b, " %s |", sec(run.allRunning))
	}
	b.WriteString("\n| last volume detached, from the first delete |")
	for _, run := range r.runs {
		fmt.Fprintf(&b, " %s |", sec(run.allDetached))
	}
	b.WriteString("\n\n")

	b.WriteString("## Cost\n\n| what | CPU (cores) | RSS (MiB) |\n|---|---|---|\n")
	fmt.Fprintf(&b, "| a hollow node at rest (kubelet + driver), over %s | %.3f | %.0f (kubelet %.0f) |\n", r.idle.period.Round(time.Second), r.idle.cores, r.idle.rssMiB, r.idle.kubelet)
	for _, run := range r.runs {
		fmt.Fprintf(&b, "| a hollow node while its %d pods start (%s), over %s | %.3f | %.0f |\n", o.podsPerNode, run.kind, run.nodes.period.Round(time.Second), run.nodes.cores, run.nodes.rssMiB)
	}
	for _, run := range r.runs {
		fmt.Fprintf(&b, "| controller %s while the pods start: %.1f CPU s | %.3f | %.0f (peak %.0f) |\n", run.kind, run.controller.cpuTotal, run.controller.cores, run.controller.rssMiB, run.controller.peakMiB)
	}
	fmt.Fprintf(&b, "\n%d hollow nodes were Ready in %s, started 4 at a time.\n", o.nodes, r.nodesStart.Round(time.Second))
	return b.String()
}

func (r *report) kinds() []string {
	var out []string
	for _, run := range r.runs {
		out = append(out, run.kind)
	}
	return out
}

func (r *report) write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base := r.started.UTC().Format("2006-01-02") + "-hollow"
	if r.opts.qps != 20 || r.opts.burst != 30 {
		base += fmt.Sprintf("-qps%g-burst%d", r.opts.qps, r.opts.burst)
	}
	path, err := uniqueReport(dir, base)
	if err != nil {
		return "", err
	}
	md := r.markdown()
	fmt.Print(md)
	return path, os.WriteFile(path, []byte(md), 0o644)
}
