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
