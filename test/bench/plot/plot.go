// Package plot draws line charts as plain SVG for the benchmark's reports:
// axes with ticks and labels, a legend under the plot, one path per series.
// A report on GitHub shows the file where it links it; no script, no font
// and no dependency beyond the standard library.
//
// Every series is one <g class="series"> element holding a <title> (its
// name, which browsers show on hover), its path and, when it has few
// points, a marker per point: a reader of the file, or a test, finds each
// series by name.
package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Point is one value of a series.
type Point struct{ X, Y float64 }

// Series is one line of a chart.
type Series struct {
	Name   string
	Points []Point
	// Color is an SVG colour; empty takes the palette's next one.
	Color string
	// Dashed draws the line dashed, e.g. a second measure of a series
	// drawn solid in the same colour.
	Dashed bool
	// Step holds each point's Y until the next point's X: counts sampled
	// only when they change would otherwise be drawn as ramps.
	Step bool
}

// Chart is a line chart.
type Chart struct {
	Title          string
	XLabel, YLabel string
	// XLog puts X on a log10 scale; every X must then be positive.
	XLog bool
	// XFormat and YFormat write a tick's label; nil writes the number.
	XFormat, YFormat func(float64) string
	Series           []Series
	// Width and Height of the image, 800 x 400 when zero.
	Width, Height int
}

// Palette is the colours series take in turn (Tableau 10): distinct for
// the colour blind in their first four.
var Palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}

const (
	fontSize     = 12
	charWidth    = 6.8 // average advance of a sans-serif character at fontSize
	legendRow    = 18
	legendSwatch = 28
	marginLeft   = 64
	marginRight  = 24
	marginTop    = 34
	// under the plot area: tick labels and the X label
	axisBelow = 44
	// series with at most this many points also get a marker per point
	maxMarked = 20
)

// SI writes 1000 as 1k, 1500 as 1.5k, 2000000 as 2M: axis labels of counts.
func SI(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return trim(v/1e6) + "M"
	case a >= 1e3:
		return trim(v/1e3) + "k"
	}
	return trim(v)
}

func trim(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// SVG draws the chart. It fails on a chart with no point, a value that is
// NaN or infinite, or a non-positive X on a log scale.
func (c Chart) SVG() ([]byte, error) {
	w, h := float64(c.Width), float64(c.Height)
	if w == 0 {
		w = 800
	}
	if h == 0 {
		h = 400
	}
	xs, ys, err := c.values()
	if err != nil {
		return nil, err
	}
	// The legend: columns as wide as the longest name allows.
	longest := 0
	for _, s := range c.Series {
		longest = max(longest, len([]rune(s.Name)))
	}
	colWidth := legendSwatch + 8 + float64(longest)*charWidth + 16
	cols := max(1, min(len(c.Series), int((w-marginLeft-marginRight)/colWidth)))
	rows := (len(c.Series) + cols - 1) / cols
	area := rect{x: marginLeft, y: marginTop, w: w - marginLeft - marginRight, h: h - marginTop - axisBelow - float64(rows)*legendRow - 6}
	if area.w < 100 || area.h < 60 {
		return nil, fmt.Errorf("chart %q: %gx%g leaves no room for the plot", c.Title, w, h)
	}
	var xAxis, yAxis axis
	if c.XLog {
		xAxis = logAxis(xs)
	} else {
		xAxis = linearAxis(xs, false)
	}
	yAxis = linearAxis(ys, true)
	px := func(x float64) float64 { return area.x + xAxis.frac(x)*area.w }
	py := func(y float64) float64 { return area.y + area.h - yAxis.frac(y)*area.h }

	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="%d">`+"\n",
		num(w), num(h), num(w), num(h), fontSize)
	fmt.Fprintf(&b, `<rect width="%s" height="%s" fill="white"/>`+"\n", num(w), num(h))
	text(&b, w/2, 20, "middle", "font-size=\"14\" font-weight=\"bold\"", c.Title)
	fmt.Fprintf(&b, `<rect class="plot-area" x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333"/>`+"\n",
		num(area.x), num(area.y), num(area.w), num(area.h))

	// Ticks and grid lines.
	xf, yf := c.XFormat, c.YFormat
	if xf == nil {
		xf = xAxis.format
	}
	if yf == nil {
		yf = yAxis.format
	}
	b.WriteString(`<g class="x-axis">` + "\n")
	for _, t := range xAxis.ticks {
		x := px(t)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`, num(x), num(area.y), num(x), num(area.y+area.h))
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333"/>`, num(x), num(area.y+area.h), num(x), num(area.y+area.h+5))
		text(&b, x, area.y+area.h+18, "middle", "", xf(t))
	}
	text(&b, area.x+area.w/2, area.y+area.h+36, "middle", "", c.XLabel)
	b.WriteString("</g>\n")
	b.WriteString(`<g class="y-axis">` + "\n")
	for _, t := range yAxis.ticks {
		y := py(t)
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`, num(area.x), num(y), num(area.x+area.w), num(y))
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333"/>`, num(area.x-5), num(y), num(area.x), num(y))
		text(&b, area.x-8, y+4, "end", "", yf(t))
	}
	fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle" transform="rotate(-90 %s %s)">%s</text>`+"\n",
		num(16), num(area.y+area.h/2), num(16), num(area.y+area.h/2), escape(c.YLabel))
	b.WriteString("</g>\n")

	// Series, then their legend entries.
	legendTop := area.y + area.h + axisBelow + 4
	for i, s := range c.Series {
		color := s.Color
		if color == "" {
			color = Palette[i%len(Palette)]
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="7 4"`
		}
		b.WriteString(`<g class="series">` + "\n<title>" + escape(s.Name) + "</title>\n")
		var d strings.Builder
		for j, p := range path(s, px, py) {
			if j == 0 {
				d.WriteString("M")
			} else {
				d.WriteString(" L")
			}
			d.WriteString(num(p.X) + " " + num(p.Y))
		}
		fmt.Fprintf(&b, `<path d="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", d.String(), color, dash)
		if len(s.Points) <= maxMarked {
			for _, p := range s.Points {
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`, num(px(p.X)), num(py(p.Y)), color)
			}
			b.WriteString("\n")
		}
		lx := area.x + float64(i%cols)*colWidth
		ly := legendTop + float64(i/cols)*legendRow
		fmt.Fprintf(&b, `<line class="legend" x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`,
			num(lx), num(ly), num(lx+legendSwatch), num(ly), color, dash)
		text(&b, lx+legendSwatch+8, ly+4, "start", `class="legend"`, s.Name)
		b.WriteString("</g>\n")
	}
	b.WriteString("</svg>\n")
	return b.Bytes(), nil
}

// values checks the chart's values and returns every X and Y.
func (c Chart) values() (xs, ys []float64, err error) {
	for _, s := range c.Series {
		for _, p := range s.Points {
			if math.IsNaN(p.X) || math.IsInf(p.X, 0) || math.IsNaN(p.Y) || math.IsInf(p.Y, 0) {
				return nil, nil, fmt.Errorf("chart %q, series %q: point (%g, %g) is not a number", c.Title, s.Name, p.X, p.Y)
			}
			if c.XLog && p.X <= 0 {
				return nil, nil, fmt.Errorf("chart %q, series %q: X %g on a log scale", c.Title, s.Name, p.X)
			}
			xs = append(xs, p.X)
			ys = append(ys, p.Y)
		}
	}
	if len(xs) == 0 {
		return nil, nil, errors.New("chart " + strconv.Quote(c.Title) + ": no point to draw")
	}
	return xs, ys, nil
}

// path is the series in image coordinates: as steps if asked, without the
// points that would not change the line (repeated, or in the middle of a
// horizontal or vertical run), which keeps a series of thousands of samples
// small.
func path(s Series, px, py func(float64) float64) []Point {
	var out []Point
	add := func(p Point) {
		p = Point{round(p.X), round(p.Y)}
		n := len(out)
		if n > 0 && out[n-1] == p {
			return
		}
		if n > 1 && (between(out[n-2], out[n-1], p, func(p Point) (float64, float64) { return p.X, p.Y }) ||
			between(out[n-2], out[n-1], p, func(p Point) (float64, float64) { return p.Y, p.X })) {
			out[n-1] = p
			return
		}
		out = append(out, p)
	}
	for i, p := range s.Points {
		if s.Step && i > 0 {
			add(Point{px(p.X), py(s.Points[i-1].Y)})
		}
		add(Point{px(p.X), py(p.Y)})
	}
	return out
}

// between: b lies on the segment from a to c, the three on one line along
// which only split's first value changes (X: a horizontal line; Y: a
// vertical one).
func between(a, b, c Point, split func(Point) (along, across float64)) bool {
	a1, a0 := split(a)
	b1, b0 := split(b)
	c1, c0 := split(c)
	return a0 == b0 && b0 == c0 && (b1-a1)*(c1-b1) >= 0
}

type rect struct{ x, y, w, h float64 }

// axis maps values to [0, 1] and has ticks at round values.
type axis struct {
	lo, hi float64
	log    bool
	ticks  []float64
	format func(float64) string
}

func (a axis) frac(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// linearAxis spans the values, from 0 when none is negative, to a round
// value, with 4 to 13 ticks a step of 1, 2 or 5 times a power of ten apart.
// With headroom, the largest value stays off the frame: a plateau at the
// top (every volume attached) is seen.
func linearAxis(vs []float64, headroom bool) axis {
	lo, hi := minMax(vs)
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		hi = lo + 1
	}
	if headroom {
		hi += (hi - lo) / 50
	}
	step := niceStep((hi - lo) / 6)
	lo = math.Floor(lo/step) * step
	hi = math.Ceil(hi/step-1e-9) * step
	decimals := max(0, int(-math.Floor(math.Log10(step))))
	a := axis{lo: lo, hi: hi, format: func(v float64) string { return strconv.FormatFloat(v, 'f', decimals, 64) }}
	for i := 0; ; i++ {
		t := lo + float64(i)*step
		if t > hi+step/2 {
			break
		}
		a.ticks = append(a.ticks, t)
	}
	return a
}

// logAxis spans the values to the powers of ten around them, a tick at each.
func logAxis(vs []float64) axis {
	lo, hi := minMax(vs)
	a := axis{log: true, lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Ceil(math.Log10(hi))), format: SI}
	if a.hi == a.lo {
		// One value, a power of ten: half a decade on each side.
		a.lo, a.hi = a.lo/math.Sqrt(10), a.hi*math.Sqrt(10)
	}
	for e := math.Ceil(math.Log10(a.lo) - 1e-9); e <= math.Log10(a.hi)+1e-9; e++ {
		a.ticks = append(a.ticks, math.Pow(10, e))
	}
	return a
}

func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func minMax(vs []float64) (lo, hi float64) {
	lo, hi = vs[0], vs[0]
	for _, v := range vs[1:] {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

func round(v float64) float64 { return math.Round(v*10) / 10 }

func num(v float64) string { return strconv.FormatFloat(round(v), 'f', -1, 64) }

func text(b *bytes.Buffer, x, y float64, anchor, attrs, s string) {
	if attrs != "" {
		attrs = " " + attrs
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="%s"%s>%s</text>`+"\n", num(x), num(y), anchor, attrs, escape(s))
}

func escape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s)) // a strings.Builder does not fail
	return b.String()
}
