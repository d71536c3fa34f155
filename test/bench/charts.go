package bench

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kube-attach/attach-detach-controller/test/bench/plot"
)

// BurstChart draws, per controller, the burst's volumes listed in their
// node's status.volumesAttached (solid) and its VolumeAttachments attached
// (dashed), from the first pod written: the median and "every volume"
// rows of the report are two points of the solid lines. ok is false when
// no burst was recorded.
func BurstChart(cfg Config, results []*Result) (c plot.Chart, ok bool) {
	c = plot.Chart{
		Title:   fmt.Sprintf("Burst of %s pods: volumes in node status (solid), VolumeAttachments attached (dashed)", plot.SI(float64(cfg.Nodes*cfg.PodsPerNode))),
		XLabel:  "seconds since the first pod was created",
		YLabel:  "volumes",
		YFormat: plot.SI,
	}
	var dashed []plot.Series
	for i, r := range results {
		p := r.Phases[PhaseBurst]
		if p == nil || p.Progress == nil || len(p.Progress.Samples) == 0 {
			continue
		}
		color := plot.Palette[i%len(plot.Palette)]
		status := plot.Series{Name: r.Controller.Title + ": in node status", Color: color, Step: true}
		attached := plot.Series{Name: r.Controller.Title + ": attached", Color: color, Step: true, Dashed: true}
		for _, s := range p.Progress.Samples {
			status.Points = append(status.Points, plot.Point{X: s.At.Seconds(), Y: float64(s.Reported)})
			attached.Points = append(attached.Points, plot.Point{X: s.At.Seconds(), Y: float64(s.Attached)})
		}
		c.Series = append(c.Series, status)
		dashed = append(dashed, attached)
	}
	c.Series = append(c.Series, dashed...)
	return c, len(c.Series) > 0
}

// costEvents names the cost benchmarks of pkg/controller for the plot's
// legend; one named "" is left out, one not listed is drawn under its own
// name.
var costEvents = map[string]string{
	"CostPodAddDelete":           "pod added, then deleted (4 writes)",
	"CostNodeStatusChange":       "node status changed by another writer",
	"CostVolumeAttachmentUpdate": "VolumeAttachment updated, nothing to do",
	"CostSync":                   "pod re-read, nothing to write",
	"CostScrape":                 "one /metrics scrape",
	"CostRecover":                "", // a restart's rebuild, not an event: seconds, off the scale
}

// costLine is a `go test -bench` result of a cost benchmark at one size:
// name, volumes, ns/op.
var costLine = regexp.MustCompile(`^Benchmark(Cost\w+)/volumes=(\d+)(?:-\d+)?\s+\d+\s+([0-9.e+]+) ns/op`)

// CostChart draws the cost benchmarks of pkg/controller found in goBench
// (`go test -bench` output), µs per event against volumes, one line per
// event; a size run more than once (-count) is drawn as its mean. ok is
// false when goBench has none.
func CostChart(goBench string) (c plot.Chart, ok bool) {
	c = plot.Chart{
		Title:  "Cost of one event by cluster size (Go benchmarks of pkg/controller)",
		XLabel: "volumes in the cluster (log scale)",
		YLabel: "µs per event",
		XLog:   true,
	}
	type sum struct {
		total float64
		n     int
	}
	var order []string
	at := map[string]map[int]*sum{}
	for _, line := range strings.Split(goBench, "\n") {
		m := costLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		name := m[1]
		if label, known := costEvents[name]; known && label == "" {
			continue
		}
		volumes, err1 := strconv.Atoi(m[2])
		ns, err2 := strconv.ParseFloat(m[3], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if at[name] == nil {
			at[name] = map[int]*sum{}
			order = append(order, name)
		}
		if at[name][volumes] == nil {
			at[name][volumes] = &sum{}
		}
		at[name][volumes].total += ns
		at[name][volumes].n++
	}
	for _, name := range order {
		label := costEvents[name]
		if label == "" {
			label = name
		}
		s := plot.Series{Name: label}
		for _, v := range slices.Sorted(maps.Keys(at[name])) {
			m := at[name][v]
			s.Points = append(s.Points, plot.Point{X: float64(v), Y: m.total / float64(m.n) / 1000})
		}
		c.Series = append(c.Series, s)
	}
	return c, len(c.Series) > 0
}
