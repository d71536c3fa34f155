package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/bench/plot"
	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// report is the run's markdown report.
type report struct {
	opts    options
	started time.Time
	runs    []*result
}

// kinds are the controllers of the run, this one first.
func (r *report) kinds() []stack.AttachDetach {
	var out []stack.AttachDetach
	for _, k := range []stack.AttachDetach{stack.Ours, stack.KubeControllerManager} {
		if slices.ContainsFunc(r.runs, func(res *result) bool { return res.kind == k }) {
			out = append(out, k)
		}
	}
	return out
}

// runsOf are the runs of kind.
func (r *report) runsOf(kind stack.AttachDetach) []*result {
	var out []*result
	for _, res := range r.runs {
		if res.kind == kind {
			out = append(out, res)
		}
	}
	return out
}

// title is how the report names a controller.
func title(kind stack.AttachDetach) string {
	if kind == stack.Ours {
		return "this controller"
	}
	return "kube-controller-manager"
}

// pooled are the pods of one phase over every run of kind.
func (r *report) pooled(kind stack.AttachDetach, ph func(*result) *phase) []times {
	var out []times
	for _, res := range r.runsOf(kind) {
		out = append(out, ph(res).pods...)
	}
	return out
}

// median is the median over the runs of kind of f: the mean of the two
// middle runs when they are even.
func (r *report) median(kind stack.AttachDetach, f func(*result) time.Duration) time.Duration {
	var ds []time.Duration
	for _, res := range r.runsOf(kind) {
		ds = append(ds, f(res))
	}
	return median(ds)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func sec(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) }

// ratio is a / b, "–" when b is 0.
func ratio(a, b time.Duration) string {
	if b == 0 {
		return "–"
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 2, 64)
}

// table writes one phase's table: the totals, then each span's
// percentiles per controller, and the ratio of this controller's to
// kube-controller-manager's when both ran.
type table struct {
	r           *report
	percentiles []float64
	phase       func(*result) *phase
}

func (t table) header(b *strings.Builder, first string) {
	kinds := t.r.kinds()
	b.WriteString("| " + first + " | who |")
	for _, k := range kinds {
		b.WriteString(" " + title(k) + " |")
	}
	if len(kinds) == 2 {
		b.WriteString(" ratio |")
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(kinds)))
	if len(kinds) == 2 {
		b.WriteString("---|")
	}
	b.WriteString("\n")
}

// total writes a row of one figure per controller (the median over runs).
func (t table) total(b *strings.Builder, what string, f func(*result) time.Duration) {
	kinds := t.r.kinds()
	fmt.Fprintf(b, "| **%s** | |", what)
	var vs []time.Duration
	for _, k := range kinds {
		v := t.r.median(k, f)
		vs = append(vs, v)
		fmt.Fprintf(b, " **%s** |", sec(v))
	}
	if len(kinds) == 2 {
		fmt.Fprintf(b, " **%s** |", ratio(vs[0], vs[1]))
	}
	b.WriteString("\n")
}

// span writes a row of a span's percentiles per controller.
func (t table) span(b *strings.Builder, s span, bold bool) {
	kinds := t.r.kinds()
	what := s.what
	if bold {
		what = "**" + what + "**"
	}
	fmt.Fprintf(b, "| %s | %s |", what, s.who)
	var ds []distribution
	for _, k := range kinds {
		d := distributionOf(s, t.r.pooled(k, t.phase))
		ds = append(ds, d)
		var ps []string
		for _, p := range t.percentiles {
			ps = append(ps, sec(d.percentile(p)))
		}
		cell := strings.Join(ps, " / ")
		if d.missing > 0 {
			cell += fmt.Sprintf(" (%d not seen)", d.missing)
		}
		fmt.Fprintf(b, " %s |", cell)
	}
	if len(kinds) == 2 {
		var rs []string
		for _, p := range t.percentiles {
			rs = append(rs, ratio(ds[0].percentile(p), ds[1].percentile(p)))
		}
		fmt.Fprintf(b, " %s |", strings.Join(rs, " / "))
	}
	b.WriteString("\n")
}

func (r *report) markdown(plotFile string) string {
	var b strings.Builder
	o := r.opts
	fmt.Fprintf(&b, "# StatefulSets in a whole cluster, %s\n\n", r.started.UTC().Format("2006-01-02 15:04 MST"))
	budget := "their defaults (qps 20, burst 30)"
	if o.qps > 0 || o.burst > 0 {
		budget = strings.Join(o.budgetArgs(), " ")
	}
	fmt.Fprintf(&b, "%d hollow nodes (the kubelet of Kubernetes v1.37.2 with a fake container runtime) in %d zones; "+
		"kube-scheduler, kube-controller-manager, the CSI external-provisioner and external-attacher of a zonal CSI mock driver, "+
		"a WaitForFirstConsumer StorageClass (test/e2e/stack StartCluster). "+
		"A StatefulSet (Parallel) of %d pods, each with its own provisioned ReadWriteOnce volume, scaled from 0, then to 0; "+
		"then a node holding %d pods of another StatefulSet drained. "+
		"Each controller in a fresh cluster, one after the other (%s): this controller beside kube-controller-manager "+
		"`--controllers=*,-attachdetach`, or kube-controller-manager `--controllers=*`. API budget of both: %s. "+
		"Machine: %d CPUs, shared with other jobs; 1-minute load average over each run in the last table. "+
		"Times are seen by the bench's watches; ratio is this controller's over kube-controller-manager's.\n\n",
		o.nodes, o.zones, o.replicas, o.drainPods, r.order(), budget, runtime.NumCPU())
	fmt.Fprintf(&b, "`%s` (`make bench-cluster`)\n\n", o.command())

	pct := []float64{50, 90, 99}
	fmt.Fprintf(&b, "## Scale-up 0 → %d, seconds p50 / p90 / p99\n\n", o.replicas)
	t := table{r: r, percentiles: pct, phase: func(res *result) *phase { return &res.scaleUp }}
	t.header(&b, "span")
	t.total(&b, "last pod Running, from the scale", func(res *result) time.Duration { return res.scaleUp.took })
	t.total(&b, "last volume in volumesAttached, from the scale", func(res *result) time.Duration {
		return since(res.scaleUp.started, res.scaleUp.pods, mListed)
	})
	u := table{r: r, percentiles: pct, phase: func(res *result) *phase { return &res.unskipped }}
	u.total(&b, "last pod Running, pods a kubelet skipped left out", func(res *result) time.Duration { return res.unskipped.took })
	t.span(&b, podStartup, true)
	u.span(&b, span{what: "pod startup, pods a kubelet skipped left out", who: "all", from: podStartup.from, to: podStartup.to}, true)
	t.span(&b, attachShare, true)
	for _, s := range startSpans {
		t.span(&b, s, false)
	}
	b.WriteString("\nA kubelet skipped a pod whose claim it read before the claim's phase was Bound (kube-scheduler binds the pod " +
		"once its claim names its volume; the PV controller writes the phase in a second write) and ran it on its retry, 10 s later; " +
		"pods skipped (of those put on their node before their claim's phase was Bound):")
	for _, res := range r.runs {
		fmt.Fprintf(&b, " %s (round %d) %d (%d);", title(res.kind), res.round, len(res.skipped), earlyBinds(res.scaleUp.pods))
	}
	b.WriteString("\n")
	if plotFile != "" {
		fmt.Fprintf(&b, "\n![Scale-up: pods Running and volumes in node status over time](%s)\n", plotFile)
	}

	pm := []float64{50, 100}
	fmt.Fprintf(&b, "\n## Drain of a node with %d stateful pods, seconds p50 / max\n\n", o.drainPods)
	t = table{r: r, percentiles: pm, phase: func(res *result) *phase { return &res.drain }}
	t.header(&b, "span")
	t.total(&b, "last pod Running on another node, from the drain", func(res *result) time.Duration { return res.drain.took })
	t.total(&b, "drain returned (every pod evicted and gone)", func(res *result) time.Duration { return res.drainReturned })
	t.span(&b, moveTotal, true)
	for _, s := range moveSpans {
		t.span(&b, s, false)
	}

	fmt.Fprintf(&b, "\n## Scale-down %d → 0, seconds p50 / p90 / p99\n\n", o.replicas)
	t = table{r: r, percentiles: pct, phase: func(res *result) *phase { return &res.scaleDown }}
	t.header(&b, "span")
	t.total(&b, "last VolumeAttachment gone, from the scale", func(res *result) time.Duration { return res.scaleDown.took })
	t.span(&b, stopTotal, true)
	for _, s := range stopSpans {
		t.span(&b, s, false)
	}

	b.WriteString("\n## Runs\n\n| round | controller | cluster start | scale-up | scale-down | drain | load average (mean, start, max) | logs |\n|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.runs {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | `%s` |\n", res.round, title(res.kind),
			sec(res.clusterStart), sec(res.scaleUp.took), sec(res.scaleDown.took), sec(res.drain.took), res.load, res.dir)
	}
	b.WriteString("\nThe drained pods' moves, node to node:")
	for _, res := range r.runs {
		fmt.Fprintf(&b, " %s (round %d) from %s to", title(res.kind), res.round, res.drainNode)
		var to []string
		for _, m := range res.moves {
			to = append(to, m.to)
		}
		slices.Sort(to)
		fmt.Fprintf(&b, " %s;", strings.Join(slices.Compact(to), ", "))
	}
	b.WriteString("\n")
	return b.String()
}

// earlyBinds counts the pods on their node before their claim's phase
// was Bound.
func earlyBinds(pods []times) int {
	n := 0
	for _, t := range pods {
		onNode, ok1 := t[mOnNode]
		bound, ok2 := t[mBound]
		if ok1 && ok2 && onNode.Before(bound) {
			n++
		}
	}
	return n
}

// order is the controllers in the order they ran.
func (r *report) order() string {
	var out []string
	for _, res := range r.runs {
		out = append(out, title(res.kind))
	}
	return strings.Join(out, ", ")
}

// scaleUpChart draws, for the first run of each controller, the
// scale-up's pods Running (solid) and volumes in node status (dashed)
// over time.
func (r *report) scaleUpChart() plot.Chart {
	c := plot.Chart{
		Title:  fmt.Sprintf("StatefulSet scale-up 0 → %d: pods Running (solid), volumes in volumesAttached (dashed)", r.opts.replicas),
		XLabel: "seconds since the scale",
		YLabel: "pods",
	}
	var dashed []plot.Series
	for i, kind := range r.kinds() {
		res := r.runsOf(kind)[0]
		name := title(kind)
		if r.opts.rounds > 1 {
			name += fmt.Sprintf(" (round %d)", res.round)
		}
		color := plot.Palette[i%len(plot.Palette)]
		c.Series = append(c.Series, cumulative(name+": Running", color, false, res.scaleUp, mRunning))
		dashed = append(dashed, cumulative(name+": listed", color, true, res.scaleUp, mListed))
	}
	c.Series = append(c.Series, dashed...)
	return c
}

// cumulative is the count of the phase's pods past m over time.
func cumulative(name, color string, dashed bool, ph phase, m milestone) plot.Series {
	var at []float64
	for _, t := range ph.pods {
		if v, ok := t[m]; ok {
			at = append(at, v.Sub(ph.started).Seconds())
		}
	}
	slices.Sort(at)
	s := plot.Series{Name: name, Color: color, Dashed: dashed, Step: true, Points: []plot.Point{{X: 0, Y: 0}}}
	for i, x := range at {
		s.Points = append(s.Points, plot.Point{X: x, Y: float64(i + 1)})
	}
	return s
}

// write writes the report and its plot into dir.
func (r *report) write(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path, err := uniqueReport(dir, r.started.UTC().Format("2006-01-02")+"-cluster")
	if err != nil {
		return "", err
	}
	svgPath := strings.TrimSuffix(path, ".md") + "-scaleup.svg"
	svg, err := r.scaleUpChart().SVG()
	if err != nil {
		return "", fmt.Errorf("plot: %w", err)
	}
	if err := os.WriteFile(svgPath, svg, 0o644); err != nil {
		return "", err
	}
	md := r.markdown(filepath.Base(svgPath))
	fmt.Print(md)
	return path, os.WriteFile(path, []byte(md), 0o644)
}

// uniqueReport returns dir/base.md, or base-2.md, base-3.md... when taken.
func uniqueReport(dir, base string) (string, error) {
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		path := filepath.Join(dir, name+".md")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return path, nil
		} else if err != nil {
			return "", err
		}
	}
}

// summary is one run's totals, printed as it ends.
func (res *result) summary() string {
	return fmt.Sprintf("  %s: scale-up %ss (pod startup p50 %ss), scale-down %ss, drain %ss; load %s\n", title(res.kind),
		sec(res.scaleUp.took), sec(distributionOf(podStartup, res.scaleUp.pods).percentile(50)),
		sec(res.scaleDown.took), sec(res.drain.took), res.load)
}

// writeMilestones writes every pod's milestones, in seconds from its
// phase's start, as CSV: phase, pod, milestone, seconds.
func writeMilestones(path string, res *result) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	w := csv.NewWriter(f)
	if err := w.Write([]string{"phase", "pod", "milestone", "seconds"}); err != nil {
		return err
	}
	for _, ph := range []struct {
		name string
		p    phase
	}{{"scale-up", res.scaleUp}, {"scale-down", res.scaleDown}, {"drain", res.drain}} {
		for i, t := range ph.p.pods {
			ms := slices.Collect(maps.Keys(t))
			slices.SortFunc(ms, func(a, b milestone) int { return t[a].Compare(t[b]) })
			for _, m := range ms {
				if err := w.Write([]string{ph.name, ph.p.names[i], string(m), strconv.FormatFloat(t[m].Sub(ph.p.started).Seconds(), 'f', 3, 64)}); err != nil {
					return err
				}
			}
		}
	}
	w.Flush()
	return w.Error()
}
