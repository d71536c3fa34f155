package bench

import (
	"strings"
	"testing"
	"time"
)

func TestReportSaysWhichPhasesRan(t *testing.T) {
	tests := []struct {
		lastPhase string
		want      []string
		notWant   []string
	}{
		{lastPhase: "", want: []string{"3 churn rounds of 50 pods"}, notWant: []string{"Phases run", "no churn"}},
		{lastPhase: PhaseRestart, want: []string{"no churn", "Phases run: up to restart;"}, notWant: []string{"churn rounds of"}},
		{lastPhase: PhaseChurn, want: []string{"3 churn rounds of 50 pods", "Phases run: up to churn;"}},
	}
	for _, tt := range tests {
		t.Run("last="+tt.lastPhase, func(t *testing.T) {
			cfg := Config{Size: "small", Nodes: 50, PodsPerNode: 10, QPS: 20, Burst: 30, ChurnRounds: 3, Idle: time.Minute, LastPhase: tt.lastPhase}
			res := &Result{Controller: Controller{Name: "ours", Title: "attach-detach-controller"}, Phases: map[string]*PhaseResult{}}
			var b strings.Builder
			if err := WriteReport(&b, cfg, Meta{Date: time.Unix(0, 0)}, []*Result{res}); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, b.String()[:min(600, b.Len())])
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(b.String(), w) {
					t.Errorf("report says %q:\n%s", w, b.String()[:min(600, b.Len())])
				}
			}
		})
	}
}

func TestReportShowsTheNewPodsWaitDuringTheTeardown(t *testing.T) {
	cfg := Config{Size: "small", Nodes: 50, PodsPerNode: 10, QPS: 20, Burst: 30, ChurnRounds: 3, Idle: time.Minute}
	result := func(name string, wait time.Duration) *Result {
		return &Result{
			Controller: Controller{Name: name, Title: name + "-title"},
			Phases:     map[string]*PhaseResult{PhaseTeardown: {Times: map[string]time.Duration{MNewPodAttached: wait / 2, MNewPodReported: wait}}},
			Requests: Requests{
				PhaseTeardown:           {"delete volumeattachments": 500, "patch nodes/status": 50},
				WindowTeardownNewVolume: {"create volumeattachments": 1, "patch nodes/status": 1, "create events": 1},
			},
		}
	}
	var b strings.Builder
	if err := WriteReport(&b, cfg, Meta{Date: time.Unix(0, 0)}, []*Result{result("ours", 1500*time.Millisecond), result("kcm", 25*time.Second)}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| teardown: a new pod's VolumeAttachment attached while the other 500 volumes detach, from the pod's creation | 0.8 | 12.5 | 0.06 |",
		"| teardown: that volume in node.status too (what the pod waits for), from the pod's creation | 1.5 | 25.0 | 0.06 |",
		"| teardown: the new pod's volume's writes (attach, node status) | 2 | 2 | 1.00 |",
		"| teardown: API writes but the new pod's volume's, events excluded (all requests) | 550 (550) | 550 (550) | 1.00 |",
		" teardown (new volume) ours | teardown (new volume) kcm |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

func TestReportShowsMovesAndTheTeardownUnderAStream(t *testing.T) {
	cfg := Config{Size: "small", Nodes: 50, PodsPerNode: 10, QPS: 20, Burst: 30, ChurnRounds: 3, Idle: time.Minute,
		MoveVolumes: 5, MoveBurst: 150, AttachDelay: 300 * time.Millisecond, StreamTeardown: 100, StreamRate: 4}
	s := time.Second
	result := func(name string, moves []time.Duration, alone, streamed time.Duration, streamWaits []time.Duration) *Result {
		return &Result{
			Controller: Controller{Name: name, Title: name + "-title"},
			Phases: map[string]*PhaseResult{
				PhaseMove:   {Times: map[string]time.Duration{MPodsWritten: s / 2, MDone: 9 * s}, Waits: map[string][]time.Duration{WaitMove: moves}},
				PhaseStream: {Times: map[string]time.Duration{MTeardownAlone: alone, MTeardownStream: streamed}, Waits: map[string][]time.Duration{WaitStream: streamWaits}},
			},
			Requests: Requests{PhaseMove: {"create volumeattachments": 155, "delete volumeattachments": 155, "patch nodes/status": 100, "create events": 10}},
		}
	}
	ours := result("ours", []time.Duration{400 * time.Millisecond, 600 * time.Millisecond, 500 * time.Millisecond, 700 * time.Millisecond, 1200 * time.Millisecond},
		6*s, 7200*time.Millisecond, []time.Duration{s, 3 * s, 2 * s, 4 * s})
	kcm := result("kcm", []time.Duration{7 * s, 7 * s, 7 * s, 8 * s, 8 * s}, 8*s, 8*s, []time.Duration{5 * s, 5 * s, 5 * s})
	var b strings.Builder
	if err := WriteReport(&b, cfg, Meta{Date: time.Unix(0, 0)}, []*Result{ours, kcm}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| move: the harness has created the burst's 150 pods | 0.5 | 0.5 | 1.00 |",
		"| move: 5 ReadWriteOnce volumes moved to another node right after the burst, old node's unmount to new node's status.volumesAttached: median (target 2.3 s: 2.0 s + the attacher's 300ms) | 0.6 | 7.0 | 0.09 |",
		"| move: slowest of the 5 (target 2.3 s) | 1.2 | 8.0 | 0.15 |",
		"| move: the burst's volumes and the moved ones attached and in node.status, from the burst's first pod | 9.0 | 9.0 | 1.00 |",
		"| move: API writes, the burst's removal included, events excluded (all requests) | 410 (420) | 410 (420) | 1.00 |",
		// Floor of 100 deletes and 50 node status patches: (150 - 30) / 20.
		"| stream: 100 volumes torn down alone, every VolumeAttachment gone | 6.0 | 8.0 | 0.75 | 6.0 | 1.00 |",
		"| stream: the same teardown while new pods arrive, 4 a second | 7.2 | 8.0 | 0.90 | 6.0 | 1.20 |",
		"| stream: teardown under the stream / alone (target 1.20 at most) | 1.20 | 1.00 | 1.20 |",
		"| stream: new pods created during the teardown | 4 | 3 | 1.33 |",
		// Median of an even count: the mean of the middle two.
		"| stream: a new pod's wait for its volume in node.status, from its creation: median | 2.5 | 5.0 | 0.50 |",
		"| stream: a new pod's wait: slowest | 4.0 | 5.0 | 0.80 |",
		" move ours | move kcm | stream ours | stream kcm |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
