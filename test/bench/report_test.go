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
