package deploy

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// catalogueFile is the metrics catalogue, relative to the repository root.
const catalogueFile = "docs/metrics.md"

// family is a metric family: its type, label names and stability level.
type family struct {
	typ    string
	labels []string // sorted; histogram le and summary quantile left out
	// stability is BETA or STABLE when the family declares it (component-base
	// begins the help with "[BETA] "; the catalogue the meaning with
	// "**BETA**"), else empty.
	stability string
}

// stabilityLevels are the levels above ALPHA that a family may declare.
var stabilityLevels = []string{"BETA", "STABLE"}

// runtimeFamilies are families documented as one row each (go_*,
// process_*), or not at all (promhttp_*): they come with the Prometheus
// client, not with the controller.
var runtimeFamilies = []string{"go_", "process_", "promhttp_"}

func isRuntime(name string) bool {
	for _, p := range runtimeFamilies {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// parseExposition reads the families of a Prometheus text exposition: the
// type from "# TYPE" lines, the stability level from "# HELP" lines and the
// label names from the samples.
func parseExposition(text string) (map[string]family, error) {
	families := map[string]family{}
	labelSets := map[string]map[string]bool{}
	levels := map[string]string{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, _ := strings.Cut(rest, " ")
			for _, l := range stabilityLevels {
				if strings.HasPrefix(help, "["+l+"] ") {
					levels[name] = l
				}
			}
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) != 2 {
				return nil, fmt.Errorf("bad TYPE line %q", line)
			}
			families[f[0]] = family{typ: f[1]}
			labelSets[f[0]] = map[string]bool{}
		}
	}
	samples, err := framework.ParseMetrics(text)
	if err != nil {
		return nil, err
	}
	for _, s := range samples {
		base := s.Name
		if _, ok := families[base]; !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(s.Name, suffix); ok {
					if _, known := families[b]; known {
						base = b
					}
				}
			}
		}
		set, ok := labelSets[base]
		if !ok {
			return nil, fmt.Errorf("sample %s of no declared family", s.Name)
		}
		for l := range s.Labels {
			if l != "le" && l != "quantile" {
				set[l] = true
			}
		}
	}
	for name, f := range families {
		f.labels = slices.Sorted(maps.Keys(labelSets[name]))
		f.stability = levels[name]
		families[name] = f
	}
	return families, nil
}

// catalogue is docs/metrics.md: the documented families, and the prefixes
// documented as one row (`go_*`).
type catalogue struct {
	families map[string]family
	prefixes []string
}

func (c catalogue) has(name string) bool {
	if _, ok := c.families[name]; ok {
		return true
	}
	for _, p := range c.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// hasSeries tells whether a series name a query uses belongs to a
// documented family: a histogram's _bucket, _sum and _count included.
func (c catalogue) hasSeries(name string) bool {
	if c.has(name) {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := c.families[base]; ok && (f.typ == "histogram" || f.typ == "summary") {
				return true
			}
		}
	}
	return false
}

var backticked = regexp.MustCompile("`([^`]*)`")

// parseCatalogue reads the Markdown tables whose rows start with a
// backticked metric name: | `name` | type | `label`, `label` or - | meaning |.
func parseCatalogue(text string) (catalogue, error) {
	c := catalogue{families: map[string]family{}}
	for n, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 4 {
			return c, fmt.Errorf("line %d: want | name | type | labels | meaning |, got %q", n+1, line)
		}
		m := backticked.FindStringSubmatch(cells[0])
		name := m[1]
		if p, ok := strings.CutSuffix(name, "*"); ok {
			c.prefixes = append(c.prefixes, p)
			continue
		}
		if _, dup := c.families[name]; dup {
			return c, fmt.Errorf("line %d: %s documented twice", n+1, name)
		}
		f := family{typ: strings.TrimSpace(cells[1])}
		for _, l := range backticked.FindAllStringSubmatch(cells[2], -1) {
			f.labels = append(f.labels, l[1])
		}
		for _, l := range stabilityLevels {
			if strings.HasPrefix(strings.TrimSpace(strings.Join(cells[3:], "|")), "**"+l+"**") {
				f.stability = l
			}
		}
		slices.Sort(f.labels)
		c.families[name] = f
	}
	if len(c.families) == 0 {
		return c, fmt.Errorf("no metric table rows")
	}
	return c, nil
}

func readCatalogue(t *testing.T) catalogue {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, catalogueFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseCatalogue(string(data))
	if err != nil {
		t.Fatalf("%s: %v", catalogueFile, err)
	}
	return c
}

// shadowPrefix starts the names of the metrics served only in shadow mode
// (TestShadowBesideKubeControllerManager checks them).
const shadowPrefix = "attachdetach_controller_shadow_"

// compareCatalogue lists the differences between what is served and what is
// documented: a served family missing from the catalogue, or documented with
// another type or other labels; and, when every documented family should
// have been served, documented families that were not.
func compareCatalogue(served map[string]family, doc catalogue, expectAll bool) []string {
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(served)) {
		f := served[name]
		if isRuntime(name) {
			if !strings.HasPrefix(name, "promhttp_") && !doc.has(name) {
				problems = append(problems, fmt.Sprintf("%s is served but no row of %s covers it", name, catalogueFile))
			}
			continue
		}
		d, ok := doc.families[name]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s (%s, labels %v) is served but not in %s", name, f.typ, f.labels, catalogueFile))
		case d.typ != f.typ:
			problems = append(problems, fmt.Sprintf("%s is a %s, %s says %s", name, f.typ, catalogueFile, d.typ))
		case !slices.Equal(d.labels, f.labels):
			problems = append(problems, fmt.Sprintf("%s has labels %v, %s says %v", name, f.labels, catalogueFile, d.labels))
		case d.stability != f.stability:
			problems = append(problems, fmt.Sprintf("%s is served at stability %q, %s says %q", name, f.stability, catalogueFile, d.stability))
		}
	}
	if expectAll {
		for _, name := range slices.Sorted(maps.Keys(doc.families)) {
			if _, ok := served[name]; !ok && !strings.HasPrefix(name, shadowPrefix) {
				problems = append(problems, fmt.Sprintf("%s is in %s but was not served", name, catalogueFile))
			}
		}
	}
	return problems
}

// TestCatalogueCheck shows that the comparison catches each kind of
// difference, so that TestMetricsCatalogue can fail.
func TestCatalogueCheck(t *testing.T) {
	exposition := `# HELP a_total [BETA] A.
# TYPE a_total counter
a_total{code="200",method="GET"} 3
a_total{code="500",method="GET"} 1
# TYPE lat_seconds histogram
lat_seconds_bucket{verb="GET",le="0.1"} 1
lat_seconds_bucket{verb="GET",le="+Inf"} 1
lat_seconds_sum{verb="GET"} 0.05
lat_seconds_count{verb="GET"} 1
# TYPE g gauge
g 1
# TYPE go_goroutines gauge
go_goroutines 12
# TYPE process_open_fds gauge
process_open_fds 9
# TYPE esc counter
esc{msg="a \"quoted\" } brace"} 1
`
	served, err := parseExposition(exposition)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]family{
		"a_total":          {"counter", []string{"code", "method"}, "BETA"},
		"lat_seconds":      {"histogram", []string{"verb"}, ""},
		"g":                {"gauge", nil, ""},
		"go_goroutines":    {"gauge", nil, ""},
		"process_open_fds": {"gauge", nil, ""},
		"esc":              {"counter", []string{"msg"}, ""},
	}
	if len(served) != len(want) {
		t.Fatalf("parsed %v, want %v", served, want)
	}
	for name, f := range want {
		if got := served[name]; got.typ != f.typ || !slices.Equal(got.labels, f.labels) || got.stability != f.stability {
			t.Errorf("%s: parsed %v, want %v", name, got, f)
		}
	}

	doc, err := parseCatalogue("| name | type | labels | meaning |\n|---|---|---|---|\n" +
		"| `a_total` | counter | `method`, `code` | **BETA**: requests |\n" +
		"| `lat_seconds` | gauge | `verb` | latency |\n" +
		"| `esc` | counter | `msg` | escapes |\n" +
		"| `stale_total` | counter | - | gone |\n" +
		"| `go_*` | various | | runtime |\n")
	if err != nil {
		t.Fatal(err)
	}
	problems := compareCatalogue(served, doc, true)
	for _, want := range []string{
		"g (gauge, labels []) is served but not in",              // undocumented
		"lat_seconds is a histogram, docs/metrics.md says gauge", // wrong type
		"process_open_fds is served but no row",                  // runtime family without a row
		"stale_total is in docs/metrics.md but was not served",
	} {
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
			t.Errorf("no problem reported containing %q; got %q", want, problems)
		}
	}
	if len(problems) != 4 {
		t.Errorf("want 4 problems, got %q", problems)
	}
	doc.families["a_total"] = family{"counter", []string{"code"}, "BETA"}
	if p := compareCatalogue(served, doc, false); !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, "a_total has labels") }) {
		t.Errorf("wrong labels not reported: %q", p)
	}
	doc.families["a_total"] = family{"counter", []string{"code", "method"}, ""}
	if p := compareCatalogue(served, doc, false); !slices.ContainsFunc(p, func(s string) bool {
		return strings.Contains(s, `a_total is served at stability "BETA", docs/metrics.md says ""`)
	}) {
		t.Errorf("undocumented stability level not reported: %q", p)
	}
	if doc.hasSeries("lat_seconds_count") {
		t.Errorf("lat_seconds_count counted as a series of the gauge lat_seconds")
	}
	doc.families["lat_seconds"] = family{"histogram", []string{"verb"}, ""}
	if !doc.hasSeries("lat_seconds_count") || !doc.hasSeries("lat_seconds_bucket") || doc.hasSeries("lat_seconds_total") {
		t.Errorf("series of the histogram lat_seconds not recognised")
	}
}
