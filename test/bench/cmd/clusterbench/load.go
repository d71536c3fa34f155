package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// load is the machine's 1-minute load average over a run, sampled.
type load struct {
	first, mean, max float64
	samples          int
}

func (l load) String() string {
	if l.samples == 0 {
		return "unknown"
	}
	return fmt.Sprintf("%.1f (start %.1f, max %.1f)", l.mean, l.first, l.max)
}

// loadSampler reads /proc/loadavg every interval until stopped.
type loadSampler struct {
	cancel context.CancelFunc
	done   chan load
}

func startLoad(ctx context.Context, interval time.Duration) *loadSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &loadSampler{cancel: cancel, done: make(chan load, 1)}
	go func() {
		var l load
		var sum float64
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			if v, err := loadAvg(); err == nil {
				if l.samples == 0 {
					l.first = v
				}
				l.samples++
				sum += v
				l.max = max(l.max, v)
			}
			select {
			case <-ctx.Done():
				if l.samples > 0 {
					l.mean = sum / float64(l.samples)
				}
				s.done <- l
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and returns what it saw.
func (s *loadSampler) stop() load {
	s.cancel()
	return <-s.done
}

// loadAvg is the 1-minute load average.
func loadAvg() (float64, error) {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, err
	}
	return parseLoadAvg(string(data))
}

func parseLoadAvg(s string) (float64, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return 0, fmt.Errorf("parse /proc/loadavg %q: empty", s)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/loadavg %q: %w", s, err)
	}
	return v, nil
}
