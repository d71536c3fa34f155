package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

// promtool finds promtool: $PROMTOOL, _output/bin/promtool (make tools puts
// it there, hack/install-promtool.sh), or the PATH.
func promtool(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("PROMTOOL"), filepath.Join(repoRoot, "_output", "bin", "promtool")} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found: run hack/install-promtool.sh (make tools does), or set PROMTOOL")
	}
	return p
}

// TestPromtool checks the shipped alert rules with promtool: `check rules`
// on the rule file as shipped, and `test rules` with the unit tests of
// testdata/alerts_test.yaml, which show each alert firing on its condition
// and quiet otherwise. The unit tests run on the rules without their
// annotations (prose, checked by `check rules` and TestAlertRules), so that
// they state conditions and labels only.
func TestPromtool(t *testing.T) {
	bin := promtool(t)
	_, objs := render(t, overlayKustomization)
	pr := find(t, objs, "PrometheusRule", "")
	spec := runtime.DeepCopyJSONValue(pr.Object["spec"]).(map[string]any)
	dir := t.TempDir()

	write := func(name string, v any) string {
		b, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
		t.Logf("promtool %v:\n%s", args[:2], out)
	}

	run("check", "rules", write("shipped.yaml", spec))

	for _, g := range spec["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			delete(r.(map[string]any), "annotations")
		}
	}
	write("rules.yaml", spec)
	tests, err := os.ReadFile(filepath.Join(repoRoot, "test", "integration", "deploy", "testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	testsPath := filepath.Join(dir, "alerts_test.yaml")
	if err := os.WriteFile(testsPath, tests, 0o644); err != nil {
		t.Fatal(err)
	}
	run("test", "rules", testsPath)

	// Every alert has a case where it fires and one where it stays quiet.
	var unit struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(tests, &unit); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range unit.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	for _, g := range spec["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			name, _ := r.(map[string]any)["alert"].(string)
			if !fires[name] || !quiet[name] {
				t.Errorf("alert %s: want a unit test where it fires (%v) and one where it stays quiet (%v)", name, fires[name], quiet[name])
			}
		}
	}
}
