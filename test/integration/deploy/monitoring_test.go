package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// dashboardFile is the Grafana dashboard, relative to the repository root.
const dashboardFile = "manifests/monitoring/grafana-dashboard.json"

// promqlKeywords are the words of PromQL that are neither functions (those
// are followed by "(") nor metric names.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true,
	"ignoring": true, "group_left": true, "group_right": true, "bool": true, "offset": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
}

var (
	promqlStrings   = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	promqlMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promqlRanges    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlGrouping  = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promqlVariables = regexp.MustCompile(`\$\{?\w+\}?`)
	promqlTokens    = regexp.MustCompile(`[0-9][\w.]*|[a-zA-Z_:][\w:]*`)
	labelValues     = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][\w:]*)`)
)

// prometheusSeries are the series Prometheus itself adds to every target.
var prometheusSeries = map[string]bool{"up": true}

// metricNames returns the metric names a PromQL expression selects.
func metricNames(expr string) []string {
	s := promqlStrings.ReplaceAllString(expr, `""`)
	s = promqlMatchers.ReplaceAllString(s, " ")
	s = promqlRanges.ReplaceAllString(s, " ")
	s = promqlGrouping.ReplaceAllString(s, " ")
	s = promqlVariables.ReplaceAllString(s, "0")
	var names []string
	for _, loc := range promqlTokens.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if tok[0] >= '0' && tok[0] <= '9' || promqlKeywords[tok] {
			continue
		}
		if next := strings.TrimLeft(s[loc[1]:], " \t\n"); strings.HasPrefix(next, "(") {
			continue // a function or an aggregation
		}
		if !slices.Contains(names, tok) {
			names = append(names, tok)
		}
	}
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`absent(up{job="x"})`, []string{"up"}},
		{`sum by (plugin_name) (rate(a_total{job="x", code=~"5.."}[5m])) > 0`, []string{"a_total"}},
		{"sum by (p) (m{state=\"desired\"})\n  >\n(sum by (p) (m{state=\"actual\"}) or sum by (p) (n) * 0)", []string{"m", "n"}},
		{`histogram_quantile(0.99, sum by (le, verb) (rate(lat_bucket{job="$job"}[$__rate_interval])))`, []string{"lat_bucket"}},
		{`count(count_over_time(g{job="a"}[1h])) > 3`, []string{"g"}},
		{`x offset 5m and on (pod) y unless ignoring (a, b) z`, []string{"x", "y", "z"}},
		{`sum without (instance) (rate(c[5m])) / ignoring (le) group_left sum(d)`, []string{"c", "d"}},
		{`label_replace(v, "dst", "$1", "src", "(.*)")`, []string{"v"}},
		{`max(a:recorded:rate5m) > 1e3`, []string{"a:recorded:rate5m"}},
	} {
		if got := metricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// TestAlertRules checks the PrometheusRule of the prometheus-operator
// overlay: every alert has a severity, a summary and a description, a valid
// `for`, selects the controller's job, and uses only catalogued metrics; and
// the rules cover what operators must be told about.
func TestAlertRules(t *testing.T) {
	_, objs := render(t, overlayKustomization)
	pr := find(t, objs, "PrometheusRule", "")
	groups, found, err := unstructured.NestedSlice(pr.Object, "spec", "groups")
	if err != nil || !found || len(groups) == 0 {
		t.Fatalf("PrometheusRule has no spec.groups (%v)", err)
	}
	doc := readCatalogue(t)
	used := map[string][]string{} // metric -> alerts
	var alerts []string
	for _, g := range groups {
		b, err := json.Marshal(g.(map[string]any)["rules"])
		if err != nil {
			t.Fatal(err)
		}
		var rules []alertRule
		if err := json.Unmarshal(b, &rules); err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			if r.Alert == "" {
				t.Errorf("a rule without alert name (recording rules are not expected here): %q", r.Expr)
				continue
			}
			alerts = append(alerts, r.Alert)
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want summary and description annotations", r.Alert)
			}
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if !strings.Contains(r.Expr, `job="attach-detach-controller-metrics"`) {
				t.Errorf("%s: does not select job=\"attach-detach-controller-metrics\" (the ServiceMonitor's job): %s", r.Alert, r.Expr)
			}
			if strings.Count(r.Expr, "(") != strings.Count(r.Expr, ")") || strings.Count(r.Expr, "{") != strings.Count(r.Expr, "}") {
				t.Errorf("%s: unbalanced brackets: %s", r.Alert, r.Expr)
			}
			names := metricNames(r.Expr)
			if len(names) == 0 {
				t.Errorf("%s: no metric in %q", r.Alert, r.Expr)
			}
			for _, m := range names {
				used[m] = append(used[m], r.Alert)
				if !doc.hasSeries(m) && !prometheusSeries[m] {
					t.Errorf("%s uses %s, which is not in %s", r.Alert, m, catalogueFile)
				}
			}
		}
	}
	if dup := duplicates(alerts); len(dup) > 0 {
		t.Errorf("alerts defined twice: %v", dup)
	}
	for _, m := range []string{
		"attachdetach_controller_total_volumes",                            // desired but not attached
		"storage_operation_duration_seconds_count",                         // detach error rate
		"storage_operation_duration_seconds_bucket",                        // attach latency
		"attach_detach_controller_attachdetach_controller_forced_detaches", // forced detaches
		"attachdetach_controller_volumes_waiting_for_node_info",            // waiting for node info, leader
		"attachdetach_controller_attach_errors_total",                      // attach error rate
	} {
		if len(used[m]) == 0 {
			t.Errorf("no alert uses %s", m)
		}
	}
}

// TestGrafanaDashboard checks that the dashboard is valid JSON with a uid,
// panels with queries, and that every query uses catalogued metrics only.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard uid %q title %q: want both", dash.UID, dash.Title)
	}
	doc := readCatalogue(t)
	check := func(where, expr string) {
		names := metricNames(expr)
		if m := labelValues.FindStringSubmatch(expr); m != nil {
			names = []string{m[1]}
		}
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			if !doc.hasSeries(n) {
				t.Errorf("%s uses %s, which is not in %s", where, n, catalogueFile)
			}
		}
	}
	var titles []string
	queries := 0
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			titles = append(titles, p.Title)
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				queries++
				check("panel "+p.Title, target.Expr)
			}
		}
	}
	walk(dash.Panels)
	if queries == 0 {
		t.Fatal("no queries in the dashboard")
	}
	if dup := duplicates(titles); len(dup) > 0 {
		t.Errorf("panel titles used twice: %v", dup)
	}
	for _, v := range dash.Templating.List {
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) == nil && strings.Contains(q.Query, "(") {
			check("variable "+v.Name, q.Query)
		}
	}
}

type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func duplicates(s []string) []string {
	seen := map[string]bool{}
	var dup []string
	for _, x := range s {
		if seen[x] && !slices.Contains(dup, x) {
			dup = append(dup, x)
		}
		seen[x] = true
	}
	return dup
}
