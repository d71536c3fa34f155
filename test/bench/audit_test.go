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
	path := writeAuditLog(t, log)
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
		{"churn round writing each change at once", f.ChurnRoundPrompt(50, 50), 8500 * time.Millisecond},
		{"teardown", f.Teardown(500, 50), 26 * time.Second},
		{"within burst", f.Writes(10), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}

func TestCountRequestsObjects(t *testing.T) {
	const ours = "system:serviceaccount:kube-system:adcbench-ours"
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	line := func(id, verb, resource, sub, name string) string {
		return `{"auditID":"` + id + `","verb":"` + verb + `","user":{"username":"` + ours + `"},"objectRef":{"resource":"` + resource +
			`","subresource":"` + sub + `","name":"` + name + `"},"requestReceivedTimestamp":"` + t0.Add(time.Second).Format(time.RFC3339Nano) + `"}`
	}
	log := strings.Join([]string{
		line("1", "create", "volumeattachments", "", "csi-new"),
		line("2", "patch", "nodes", "status", "canary"),
		line("3", "patch", "nodes", "status", "node-1"),
		line("4", "list", "pods", "", ""),
	}, "\n") + "\n"
	path := writeAuditLog(t, log)
	end := t0.Add(time.Minute)
	got, err := CountRequests(path, ours, []Window{
		{Name: "new", Start: t0, End: end, Objects: map[string]bool{"csi-new": true, "canary": true}},
		{Name: "restart", Start: t0, End: end},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Requests{
		"new":     {"create volumeattachments": 1, "patch nodes/status": 1},
		"restart": {"patch nodes/status": 1, "list pods": 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("CountRequests = %v, want %v", got, want)
	}
}

func TestAuditTailBusy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(`{"auditID":"0","verb":"create","objectRef":{"resource":"pods"}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tail := newAuditTail(path) // starts at the end: the create above is old
	appendLog := func(s string) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, appended string
		want           bool
	}{
		{"nothing new", "", false},
		{"discovery only", `{"auditID":"1","verb":"get"}` + "\n", false},
		{"half a line", `{"auditID":"2","verb":"pat`, false},
		{"its end, a write", `ch","objectRef":{"resource":"nodes","subresource":"status"}}` + "\n", true},
		{"a resource get", `{"auditID":"3","verb":"get","objectRef":{"resource":"nodes"}}` + "\n", true},
		{"read once", "", false},
	} {
		appendLog(tc.appended)
		got, err := tail.busy()
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: busy = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLogScan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kcm.log")
	if err := os.WriteFile(path, []byte("I1123 starting\nI1123 \"Caches are"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &logScan{path: path, want: []byte(`"Caches are synced"`)}
	if s.found() {
		t.Fatal("found before the message is complete")
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(" synced\"\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if !s.found() {
		t.Error("not found once the message is complete across two reads")
	}
}

// writeAuditLog writes content as an audit log file and returns its path.
func writeAuditLog(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.log")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
