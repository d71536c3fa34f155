package framework

import (
	"maps"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP storage_operation_duration_seconds Storage operation duration
# TYPE storage_operation_duration_seconds histogram
storage_operation_duration_seconds_count{migrated="false",operation_name="volume_attach",status="success",volume_plugin="kubernetes.io/csi:a"} 3
storage_operation_duration_seconds_count{migrated="true",operation_name="volume_attach",status="success",volume_plugin="kubernetes.io/csi:b"} 2
storage_operation_duration_seconds_count{migrated="false",operation_name="volume_detach",status="success",volume_plugin="kubernetes.io/csi:a"} 1
odd{msg="a \"quoted\", comma\\ and } brace",x="1"} 1.5e+00 1700000000000
b{x="q\"uo,te}"} 2.5e-3
go_goroutines 42
`
	m, err := ParseMetrics(text)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"storage_operation_duration_seconds_count", map[string]string{"operation_name": "volume_attach"}, 5},
		{"storage_operation_duration_seconds_count", map[string]string{"operation_name": "volume_attach", "migrated": "true"}, 2},
		{"storage_operation_duration_seconds_count", nil, 6},
		{"storage_operation_duration_seconds_count", map[string]string{"operation_name": "nope"}, 0},
		{"odd", map[string]string{"msg": `a "quoted", comma\ and } brace`, "x": "1"}, 1.5},
		{"b", map[string]string{"x": `q"uo,te}`}, 0.0025},
		{"go_goroutines", nil, 42},
	} {
		if got := m.Sum(tc.name, tc.match); got != tc.want {
			t.Errorf("Sum(%s, %v) = %v, want %v", tc.name, tc.match, got, tc.want)
		}
	}
	// Labels are parsed exactly: no more, no fewer.
	for name, want := range map[string]map[string]string{
		"go_goroutines": {},
		"b":             {"x": `q"uo,te}`},
	} {
		got := m.Select(name, nil)
		if len(got) != 1 || !maps.Equal(got[0].Labels, want) {
			t.Errorf("Select(%s) = %+v, want one sample with labels %v", name, got, want)
		}
	}
	for _, bad := range []string{`x{a="1"`, `x{a=1} 2`, `x`, `x{a="1"} notanumber`, `c{x="open} 1`} {
		if _, err := ParseMetrics(bad); err == nil {
			t.Errorf("ParseMetrics(%q) succeeded, want an error", bad)
		}
	}
}
