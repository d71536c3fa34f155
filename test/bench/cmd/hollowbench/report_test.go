package main

import (
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 200; i++ {
		d = append(d, time.Duration(i)*time.Second)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 100 * time.Second}, {90, 180 * time.Second}, {99, 198 * time.Second}, {100, 200 * time.Second}, {0, time.Second}} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("p%g = %s, want %s", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %s, want 0", got)
	}
}

func TestCostOf(t *testing.T) {
	at := time.Now()
	before := []framework.Stats{{At: at, CPUTicks: 100, RSSKiB: 1024}, {At: at, CPUTicks: 0, RSSKiB: 1024}}
	after := []framework.Stats{{At: at.Add(10 * time.Second), CPUTicks: 300, RSSKiB: 2048, HWMKiB: 4096}, {At: at.Add(10 * time.Second), CPUTicks: 200, RSSKiB: 2048}}
	c := costOf(before, after, 2)
	// 4 CPU seconds over 10 s among 2 members; 4 MiB among 2.
	if c.cpuTotal != 4 || c.cores != 0.2 || c.rssMiB != 2 || c.peakMiB != 4 {
		t.Errorf("costOf = %+v, want 4 CPU s, 0.2 cores, 2 MiB each, peak 4 MiB", c)
	}
}
