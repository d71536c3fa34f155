package plot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgDoc is what the tests read back from a chart.
type svgDoc struct {
	XMLName xml.Name  `xml:"svg"`
	Width   string    `xml:"width,attr"`
	Height  string    `xml:"height,attr"`
	Rects   []svgRect `xml:"rect"`
	Groups  []svgG    `xml:"g"`
}

type svgRect struct {
	Class string  `xml:"class,attr"`
	X     float64 `xml:"x,attr"`
	Y     float64 `xml:"y,attr"`
	W     float64 `xml:"width,attr"`
	H     float64 `xml:"height,attr"`
}

type svgG struct {
	Class string `xml:"class,attr"`
	Title string `xml:"title"`
	Paths []struct {
		D    string `xml:"d,attr"`
		Dash string `xml:"stroke-dasharray,attr"`
	} `xml:"path"`
	Circles []struct{} `xml:"circle"`
	Texts   []struct {
		Class string `xml:"class,attr"`
		Value string `xml:",chardata"`
	} `xml:"text"`
}

// render draws c and checks what every chart must be: well-formed XML,
// one series group per series in order, named in its title and legend,
// every point of every path inside the plot area. It returns the plot
// area and each series' path points.
func render(t *testing.T, c Chart) (svgRect, map[string][]Point, svgDoc) {
	t.Helper()
	out, err := c.SVG()
	if err != nil {
		t.Fatalf("SVG: %v", err)
	}
	dec := xml.NewDecoder(bytes.NewReader(out))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, out)
		}
	}
	var doc svgDoc
	if err := xml.Unmarshal(out, &doc); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	var area svgRect
	for _, r := range doc.Rects {
		if r.Class == "plot-area" {
			area = r
		}
	}
	if area.W <= 0 || area.H <= 0 {
		t.Fatalf("no plot area: %+v", doc.Rects)
	}
	var names []string
	paths := map[string][]Point{}
	for _, g := range doc.Groups {
		if g.Class != "series" {
			continue
		}
		names = append(names, g.Title)
		if len(g.Paths) != 1 {
			t.Fatalf("series %q: %d paths, want 1", g.Title, len(g.Paths))
		}
		legend := false
		for _, tx := range g.Texts {
			legend = legend || tx.Class == "legend" && tx.Value == g.Title
		}
		if !legend {
			t.Errorf("series %q has no legend entry", g.Title)
		}
		pts := parsePath(t, g.Paths[0].D)
		for _, p := range pts {
			if p.X < area.X-0.1 || p.X > area.X+area.W+0.1 || p.Y < area.Y-0.1 || p.Y > area.Y+area.H+0.1 {
				t.Errorf("series %q: point %v outside the plot area %+v", g.Title, p, area)
			}
		}
		paths[g.Title] = pts
	}
	var want []string
	for _, s := range c.Series {
		want = append(want, s.Name)
	}
	if !slices.Equal(names, want) {
		t.Fatalf("series drawn %q, want %q", names, want)
	}
	return area, paths, doc
}

func parsePath(t *testing.T, d string) []Point {
	t.Helper()
	var pts []Point
	for _, part := range strings.FieldsFunc(d, func(r rune) bool { return r == 'M' || r == 'L' }) {
		f := strings.Fields(part)
		if len(f) != 2 {
			t.Fatalf("path %q: bad point %q", d, part)
		}
		x, err1 := strconv.ParseFloat(f[0], 64)
		y, err2 := strconv.ParseFloat(f[1], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("path %q: bad point %q", d, part)
		}
		pts = append(pts, Point{x, y})
	}
	if len(pts) == 0 {
		t.Fatalf("empty path")
	}
	return pts
}

func near(a, b float64) bool { return math.Abs(a-b) <= 0.1 }

func axisLabels(doc svgDoc, class string) []string {
	var out []string
	for _, g := range doc.Groups {
		if g.Class == class {
			for _, tx := range g.Texts {
				out = append(out, tx.Value)
			}
		}
	}
	return out
}

func TestLinearChartMapsValuesToThePlotArea(t *testing.T) {
	c := Chart{
		Title: "burst", XLabel: "seconds", YLabel: "volumes",
		Series: []Series{
			{Name: "ours <fast> & co", Points: []Point{{0, 0}, {10, 250}, {26, 450}}, Step: true},
			{Name: "kcm", Points: []Point{{0, 0}, {20, 100}, {30, 490}}, Step: true, Dashed: true},
		},
	}
	area, paths, doc := render(t, c)
	if doc.Width != "800" || doc.Height != "400" {
		t.Errorf("size %sx%s, want 800x400", doc.Width, doc.Height)
	}
	// X spans 0 to 30, Y 0 to 500 (490 and some room above it): (0, 0) is
	// the bottom left corner, (30, 500) the top right one.
	ours, kcm := paths["ours <fast> & co"], paths["kcm"]
	if p := ours[0]; !near(p.X, area.X) || !near(p.Y, area.Y+area.H) {
		t.Errorf("(0, 0) drawn at %v, want the bottom left corner (%g, %g)", p, area.X, area.Y+area.H)
	}
	if p, y := kcm[len(kcm)-1], area.Y+area.H/50; !near(p.X, area.X+area.W) || !near(p.Y, y) {
		t.Errorf("(30, 490) drawn at %v, want (%g, %g), next to the top right corner", p, area.X+area.W, y)
	}

	// Steps: each segment horizontal or vertical, the count held until
	// the next sample: (10, 0) then (10, 250).
	for name, pts := range paths {
		for i := 1; i < len(pts); i++ {
			if pts[i].X != pts[i-1].X && pts[i].Y != pts[i-1].Y {
				t.Errorf("series %q: segment %v-%v is not a step", name, pts[i-1], pts[i])
			}
		}
	}
	x10 := area.X + area.W/3
	if !slices.ContainsFunc(ours, func(p Point) bool { return near(p.X, x10) && near(p.Y, area.Y+area.H) }) {
		t.Errorf("ours: no step at (10, 0) = (%g, %g): %v", x10, area.Y+area.H, ours)
	}
	for _, want := range []string{"0", "10", "30", "seconds"} {
		if !slices.Contains(axisLabels(doc, "x-axis"), want) {
			t.Errorf("x axis lacks %q: %q", want, axisLabels(doc, "x-axis"))
		}
	}
	for _, want := range []string{"0", "100", "500", "volumes"} {
		if !slices.Contains(axisLabels(doc, "y-axis"), want) {
			t.Errorf("y axis lacks %q: %q", want, axisLabels(doc, "y-axis"))
		}
	}
}

func TestTheLargestValueStaysOffTheFrame(t *testing.T) {
	// Every volume in: the plateau must show.
	area, paths, _ := render(t, Chart{Series: []Series{{Name: "a", Points: []Point{{0, 0}, {10, 500}, {20, 500}}}}})
	if p := paths["a"][len(paths["a"])-1]; p.Y < area.Y+area.H/20 {
		t.Errorf("500 of 500 drawn at y=%g, on the frame at %g", p.Y, area.Y)
	}
}

func TestLogChartSpacesDecadesEvenly(t *testing.T) {
	c := Chart{
		Title: "cost", XLabel: "volumes", YLabel: "µs per event", XLog: true,
		Series: []Series{
			{Name: "pod added then deleted", Points: []Point{{1000, 90}, {10000, 91}, {100000, 102}}},
			{Name: "VolumeAttachment update", Points: []Point{{1000, 4.6}, {10000, 6.7}, {100000, 7.4}}},
			{Name: "scrape", Points: []Point{{1000, 64}, {10000, 46}, {100000, 56}}},
		},
	}
	area, paths, doc := render(t, c)
	pts := paths["VolumeAttachment update"]
	if len(pts) != 3 {
		t.Fatalf("VolumeAttachment update: %d points, want 3: %v", len(pts), pts)
	}
	for i, want := range []float64{area.X, area.X + area.W/2, area.X + area.W} {
		if !near(pts[i].X, want) {
			t.Errorf("point %d at x=%g, want %g (1k, 10k, 100k on a log scale)", i, pts[i].X, want)
		}
	}
	for _, want := range []string{"1k", "10k", "100k"} {
		if !slices.Contains(axisLabels(doc, "x-axis"), want) {
			t.Errorf("x axis lacks %q: %q", want, axisLabels(doc, "x-axis"))
		}
	}
	for _, g := range doc.Groups {
		if g.Class == "series" && len(g.Circles) != 3 {
			t.Errorf("series %q: %d markers, want one a point", g.Title, len(g.Circles))
		}
	}
}

func TestOneSizeIsDrawnAsPoints(t *testing.T) {
	// Go benchmarks run with -short measure one size only.
	c := Chart{XLog: true, Series: []Series{{Name: "a", Points: []Point{{1000, 90}}}, {Name: "b", Points: []Point{{1000, 5}}}}}
	area, paths, _ := render(t, c)
	if p := paths["a"][0]; !near(p.X, area.X+area.W/2) {
		t.Errorf("the only size drawn at x=%g, want the middle %g", p.X, area.X+area.W/2)
	}
}

func TestLongSeriesStaySmall(t *testing.T) {
	// A burst of 100,000 volumes sampled every 500 ms for 10 minutes.
	var pts []Point
	for i := range 1200 {
		pts = append(pts, Point{float64(i) / 2, float64(min(i*100, 100000))})
	}
	c := Chart{Series: []Series{{Name: "s", Points: pts, Step: true}}}
	out, err := c.SVG()
	if err != nil {
		t.Fatal(err)
	}
	_, paths, _ := render(t, c)
	if n := len(paths["s"]); n > 2*1200 || len(out) > 64<<10 {
		t.Errorf("%d path points, %d bytes", n, len(out))
	}
	// Once every volume is in, the line is one segment to the end.
	last := paths["s"][len(paths["s"])-2:]
	if last[0].Y != last[1].Y {
		t.Errorf("the plateau ends in %v, want one horizontal segment", last)
	}
}

func TestChartsThatCannotBeDrawn(t *testing.T) {
	for name, c := range map[string]Chart{
		"no point":          {Series: []Series{{Name: "a"}}},
		"no series":         {},
		"NaN":               {Series: []Series{{Name: "a", Points: []Point{{1, math.NaN()}}}}},
		"zero on log scale": {XLog: true, Series: []Series{{Name: "a", Points: []Point{{0, 1}, {10, 2}}}}},
		"too small":         {Width: 100, Height: 50, Series: []Series{{Name: "a", Points: []Point{{0, 1}}}}},
	} {
		if _, err := c.SVG(); err == nil {
			t.Errorf("%s: drawn, want an error", name)
		}
	}
}

func TestSI(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 500: "500", 1000: "1k", 1500: "1.5k", 100000: "100k", 2e6: "2M"} {
		if got := SI(v); got != want {
			t.Errorf("SI(%g) = %q, want %q", v, got, want)
		}
	}
}
