package shadow

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

func TestTracker(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	k := cache.Key{Volume: "kubernetes.io/csi/d^h", Node: "n1"}
	attach := Verdict{Kind: WouldAttach, Ours: "attach: not attached yet", Cluster: "not attached"}
	detach := Verdict{Kind: WouldDetach, Ours: "withdraw: no pod wants it", Cluster: "attached"}
	agree := Verdict{}
	pods := []string{"ns/p"}

	type step struct {
		at        time.Duration
		v         Verdict
		wantAfter time.Duration
		// open counts by kind after the step; opened: the counter.
		open, opened map[Kind]float64
	}
	none := map[Kind]float64{}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "agreement reports nothing", steps: []step{
			{at: 0, v: agree, open: none, opened: none},
			{at: time.Hour, v: agree, open: none, opened: none},
		}},
		{name: "shorter than the grace period: not reported", steps: []step{
			{at: 0, v: attach, wantAfter: 30 * time.Second, open: none, opened: none},
			{at: 10 * time.Second, v: attach, wantAfter: 20 * time.Second, open: none, opened: none},
			{at: 29 * time.Second, v: agree, open: none, opened: none},
			{at: 2 * time.Minute, v: agree, open: none, opened: none},
		}},
		{name: "longer than the grace period: reported once, then closed", steps: []step{
			{at: 0, v: attach, wantAfter: 30 * time.Second, open: none, opened: none},
			{at: 30 * time.Second, v: attach, open: map[Kind]float64{WouldAttach: 1}, opened: map[Kind]float64{WouldAttach: 1}},
			{at: time.Minute, v: attach, open: map[Kind]float64{WouldAttach: 1}, opened: map[Kind]float64{WouldAttach: 1}},
			{at: 2 * time.Minute, v: agree, open: none, opened: map[Kind]float64{WouldAttach: 1}},
		}},
		{name: "a change of kind starts over", steps: []step{
			{at: 0, v: attach, wantAfter: 30 * time.Second, open: none, opened: none},
			{at: 40 * time.Second, v: attach, open: map[Kind]float64{WouldAttach: 1}, opened: map[Kind]float64{WouldAttach: 1}},
			{at: 50 * time.Second, v: detach, wantAfter: 30 * time.Second, open: none, opened: map[Kind]float64{WouldAttach: 1}},
			{at: 80 * time.Second, v: detach, open: map[Kind]float64{WouldDetach: 1}, opened: map[Kind]float64{WouldAttach: 1, WouldDetach: 1}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			reg := prometheus.NewRegistry()
			tr, err := NewTracker(30*time.Second, start, reg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				if got := tr.Record(ctx, k, s.v, pods, at(s.at)); got != s.wantAfter {
					t.Errorf("step %d: look again after %s, want %s", i, got, s.wantAfter)
				}
				for _, kind := range Kinds() {
					if got := testutil.ToFloat64(tr.open.WithLabelValues(string(kind))); got != s.open[kind] {
						t.Errorf("step %d: open %s = %v, want %v", i, kind, got, s.open[kind])
					}
					if got := testutil.ToFloat64(tr.opened.WithLabelValues(string(kind))); got != s.opened[kind] {
						t.Errorf("step %d: opened %s = %v, want %v", i, kind, got, s.opened[kind])
					}
				}
			}
		})
	}
}

func TestSummary(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr, err := NewTracker(time.Second, start, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := cache.Key{Volume: "kubernetes.io/aws-ebs/vol-1", Node: "n1"}
	young := cache.Key{Volume: "kubernetes.io/csi/d^h", Node: "n2"}
	gone := cache.Key{Volume: "kubernetes.io/csi/d^g", Node: "n2"}
	pending := cache.Key{Volume: "kubernetes.io/csi/d^p", Node: "n2"}
	notAttach := Verdict{Kind: WouldNotAttach, Ours: "blocked: waiting for CSINode n1", Cluster: "attached"}
	detach := Verdict{Kind: WouldDetach, Ours: "withdraw: no pod wants it", Cluster: "attached"}
	tr.Record(ctx, old, notAttach, []string{"ns/a"}, start)
	tr.Record(ctx, old, notAttach, []string{"ns/a"}, start.Add(time.Minute))
	tr.Record(ctx, young, detach, nil, start.Add(time.Minute))
	tr.Record(ctx, young, detach, nil, start.Add(2*time.Minute))
	tr.Record(ctx, gone, detach, nil, start)
	tr.Record(ctx, gone, detach, nil, start.Add(time.Minute))
	tr.Record(ctx, gone, Verdict{}, nil, start.Add(3*time.Minute))
	tr.Record(ctx, pending, detach, nil, start.Add(3*time.Minute))

	s := tr.Summary()
	if s.Open[WouldNotAttach] != 1 || s.Open[WouldDetach] != 1 || s.Open[WouldAttach] != 0 {
		t.Errorf("open = %v, want one would-not-attach and one would-detach", s.Open)
	}
	if s.Opened[WouldDetach] != 2 || s.Opened[WouldNotAttach] != 1 {
		t.Errorf("opened = %v, want 2 would-detach and 1 would-not-attach", s.Opened)
	}
	if s.Pending != 1 {
		t.Errorf("pending = %d, want 1", s.Pending)
	}
	if len(s.Oldest) != 2 || s.Oldest[0].Volume != string(old.Volume) || s.Oldest[1].Volume != string(young.Volume) {
		t.Errorf("oldest open = %+v, want %s then %s", s.Oldest, old.Volume, young.Volume)
	}
	if len(s.Oldest) > 0 && (len(s.Oldest[0].Pods) != 1 || !strings.Contains(s.Oldest[0].Ours, "CSINode")) {
		t.Errorf("oldest open = %+v, want its pod and our reason", s.Oldest[0])
	}
	if len(s.Closed) != 1 || s.Closed[0].Volume != string(gone.Volume) || s.Closed[0].Ended == nil || !s.Closed[0].Ended.Equal(start.Add(3*time.Minute)) {
		t.Errorf("closed = %+v, want %s ended at +3m", s.Closed, gone.Volume)
	}
}
