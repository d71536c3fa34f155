package bench

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/bench/plot"
)

func TestProgressKeepsChangesAndTheEndOfEachPlateau(t *testing.T) {
	var p Progress
	for i, s := range []Snapshot{
		{Exist: 0}, {Exist: 0}, {Exist: 0}, // a plateau: its first and last sample
		{Exist: 3, Attached: 1}, {Exist: 3, Attached: 3}, // changes: every one
		{Exist: 3, Attached: 3, Reported: 3}, {Exist: 3, Attached: 3, Reported: 3}, {Exist: 3, Attached: 3, Reported: 3},
	} {
		p.add(time.Duration(i)*time.Second, s)
	}
	want := []Sample{
		{At: 0}, {At: 2 * time.Second},
		{At: 3 * time.Second, Exist: 3, Attached: 1}, {At: 4 * time.Second, Exist: 3, Attached: 3},
		{At: 5 * time.Second, Exist: 3, Attached: 3, Reported: 3}, {At: 7 * time.Second, Exist: 3, Attached: 3, Reported: 3},
	}
	if !slices.Equal(p.Samples, want) {
		t.Errorf("samples\n%v\nwant\n%v", p.Samples, want)
	}
}

func TestBurstChartDrawsEveryControllersBurst(t *testing.T) {
	result := func(name string, progress *Progress) *Result {
		return &Result{Controller: Controller{Name: name, Title: name + "-title"}, Phases: map[string]*PhaseResult{PhaseBurst: {Progress: progress}}}
	}
	ours := &Progress{Samples: []Sample{{At: 100 * time.Millisecond}, {At: 14 * time.Second, Exist: 300, Attached: 300, Reported: 250}, {At: 26 * time.Second, Exist: 500, Attached: 500, Reported: 500}}}
	kcm := &Progress{Samples: []Sample{{At: 100 * time.Millisecond}, {At: 24 * time.Second, Exist: 500, Attached: 480}, {At: 29 * time.Second, Exist: 500, Attached: 500, Reported: 500}}}
	c, ok := BurstChart(Config{Nodes: 50, PodsPerNode: 10}, []*Result{result("ours", ours), result("kcm", kcm), result("failed", nil)})
	if !ok {
		t.Fatal("no chart")
	}
	var names []string
	for _, s := range c.Series {
		names = append(names, s.Name)
	}
	want := []string{"ours-title: in node status", "kcm-title: in node status", "ours-title: attached", "kcm-title: attached"}
	if !slices.Equal(names, want) {
		t.Fatalf("series %q, want %q", names, want)
	}
	if got := c.Series[0].Points[1]; got != (plot.Point{X: 14, Y: 250}) {
		t.Errorf("ours in node status at 14 s: %v, want 250", got)
	}
	if got := c.Series[3].Points[1]; got != (plot.Point{X: 24, Y: 480}) || !c.Series[3].Dashed || c.Series[3].Color != c.Series[1].Color {
		t.Errorf("kcm attached at 24 s: %v, want 480, dashed in kcm's colour", got)
	}
	if _, err := c.SVG(); err != nil {
		t.Errorf("SVG: %v", err)
	}
	if _, ok := BurstChart(Config{}, []*Result{result("failed", nil)}); ok {
		t.Error("a chart drawn with no burst recorded")
	}
}

const goBenchFull = `pkg: github.com/kube-attach/attach-detach-controller/pkg/controller
BenchmarkCostPodAddDelete/volumes=1000-2         	   14606	     90503 ns/op	   44595 B/op	     520 allocs/op
BenchmarkCostPodAddDelete/volumes=10000-2        	   14246	     90081 ns/op	   44601 B/op	     519 allocs/op
BenchmarkCostPodAddDelete/volumes=100000-2       	   17247	    101952 ns/op	   44617 B/op	     519 allocs/op
BenchmarkCostVolumeAttachmentUpdate/volumes=1000-2         	  239840	      4610 ns/op	    1551 B/op	      32 allocs/op
BenchmarkCostVolumeAttachmentUpdate/volumes=10000-2        	  183049	      6740 ns/op	    1570 B/op	      34 allocs/op
BenchmarkCostVolumeAttachmentUpdate/volumes=100000-2       	  165507	      7355 ns/op	    1575 B/op	      34 allocs/op
BenchmarkCostScrape/volumes=1000-2                         	   46777	     64633 ns/op	      1325 bytes/scrape	   38976 B/op	     138 allocs/op
BenchmarkCostScrape/volumes=1000-2                         	   46777	     64000 ns/op	      1325 bytes/scrape	   38976 B/op	     138 allocs/op
BenchmarkCostNew/volumes=10000-2                           	   60342	     46439 ns/op
BenchmarkControllerMemory/volumes=1000-2                   	1000000000	         0.5599 ns/op	     10723 heap-bytes/volume
BenchmarkCostRecover/volumes=1000-2                        	     132	   8448312 ns/op	      8578 ns/volume	 3604784 B/op	   34750 allocs/op
BenchmarkDecide/attached-2         	 4158721	       345.0 ns/op	      56 B/op	       2 allocs/op
`

func TestCostChartDrawsEachEventAtEachSize(t *testing.T) {
	c, ok := CostChart(goBenchFull)
	if !ok {
		t.Fatal("no chart")
	}
	got := map[string][]plot.Point{}
	var names []string
	for _, s := range c.Series {
		names = append(names, s.Name)
		got[s.Name] = s.Points
	}
	// File order; the restart's rebuild and the memory benchmark are no
	// event; an unknown cost benchmark keeps its name.
	want := []string{costEvents["CostPodAddDelete"], costEvents["CostVolumeAttachmentUpdate"], costEvents["CostScrape"], "CostNew"}
	if !slices.Equal(names, want) {
		t.Fatalf("series %q, want %q", names, want)
	}
	if p := got[costEvents["CostPodAddDelete"]]; !slices.Equal(p, []plot.Point{{X: 1000, Y: 90.503}, {X: 10000, Y: 90.081}, {X: 100000, Y: 101.952}}) {
		t.Errorf("pod add+delete: %v", p)
	}
	if p := got[costEvents["CostScrape"]]; !slices.Equal(p, []plot.Point{{X: 1000, Y: 64.3165}}) {
		t.Errorf("scrape run twice at 1,000: %v, want the mean", p)
	}
	if !c.XLog {
		t.Error("volumes not on a log scale")
	}
	if _, err := c.SVG(); err != nil {
		t.Errorf("SVG: %v", err)
	}
	if _, ok := CostChart("BenchmarkDecide/attached-2 	 4158721	       345.0 ns/op\n"); ok {
		t.Error("a chart drawn with no cost benchmark")
	}
}

func TestReportLinksItsPlots(t *testing.T) {
	cfg := Config{Size: "small", Nodes: 50, PodsPerNode: 10, QPS: 20, Burst: 30, Idle: time.Minute, Poll: 100 * time.Millisecond}
	res := &Result{Controller: Controller{Name: "ours", Title: "attach-detach-controller"}, Phases: map[string]*PhaseResult{}}
	for _, tt := range []struct {
		meta    Meta
		want    []string
		notWant []string
	}{
		{meta: Meta{GoBench: goBenchFull, BurstPlot: "r-burst.svg", CostPlot: "r-cost.svg"}, want: []string{"](r-burst.svg)", "](r-cost.svg)", "sampled every 100ms"}},
		{meta: Meta{GoBench: goBenchFull}, notWant: []string{".svg)"}},
	} {
		var b strings.Builder
		tt.meta.Date = time.Unix(0, 0)
		if err := WriteReport(&b, cfg, tt.meta, []*Result{res}); err != nil {
			t.Fatal(err)
		}
		for _, w := range tt.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("report lacks %q", w)
			}
		}
		for _, w := range tt.notWant {
			if strings.Contains(b.String(), w) {
				t.Errorf("report has %q", w)
			}
		}
	}
}
