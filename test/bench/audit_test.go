package bench

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestCountRequests(t *testing.T) {
	const ours = "system:serviceaccount:kube-system:adcbench-ours"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	line := func(id, stage, user, verb, resource, sub string, at time.Duration) string {
		ref := ""
		if resource != "" {
			ref = `,"objectRef":{"resource":"` + resource + `","subresource":"` + sub + `"}`
		}
		return `{"auditID":"` + id + `","stage":"` + stage + `","verb":"` + verb + `","user":{"username":"` + user + `"}` + ref +
			`,"requestReceivedTimestamp":"` + t0.Add(at).Format("2006-01-02T15:04:05.000000Z07:00") + `"}`
	}
	log := strings.Join([]string{
		line("1", "ResponseComplete", ours, "create", "volumeattachments", "", time.Second),
		line("2", "ResponseStarted", ours, "watch", "pods", "", 2*time.Second),
		line("2", "ResponseComplete", ours, "watch", "pods", "", 2*time.Second), // same request
		line("3", "ResponseComplete", ours, "patch", "nodes", "status", 11*time.Second),
		line("4", "ResponseComplete", "system:serviceaccount:kube-system:adcbench-kcm", "patch", "nodes", "status", 12*time.Second),
		line("5", "ResponseComplete", ours, "get", "", "", 13*time.Second),
		line("6", "ResponseComplete", ours, "delete", "volumeattachments", "", 30*time.Second), // in no window
	}, "\n") + "\n"
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := CountRequests(path, ours, []Window{
		{Name: "a", Start: t0, End: t0.Add(10 * time.Second)},
		{Name: "b", Start: t0.Add(10 * time.Second), End: t0.Add(20 * time.Second)},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Requests{
		"a": {"create volumeattachments": 1, "watch pods": 1},
		"b": {"patch nodes/status": 1, "get (discovery)": 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("CountRequests = %v, want %v", got, want)
	}
	if w := got.Writes("b", false); w != 1 {
		t.Errorf("Writes(b) = %d, want 1", w)
	}
}

func TestFloors(t *testing.T) {
	f := Floors{QPS: 20, Burst: 30}
	for _, tc := range []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"burst creates", f.BurstCreates(500), 23500 * time.Millisecond},
		{"burst status", f.BurstStatus(500, 50), 26 * time.Second},
		{"churn round", f.ChurnRound(50, 50), 6 * time.Second},
		{"teardown", f.Teardown(500, 50), 26 * time.Second},
		{"within burst", f.Writes(10), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}
