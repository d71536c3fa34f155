package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/bench"
	"github.com/kube-attach/attach-detach-controller/test/bench/plot"
)

// writePlots writes the burst and cost plots beside the report, as
// <report>-burst.svg and <report>-cost.svg (report without .md), and
// returns their names for the report's links, empty for a plot with
// nothing to draw or not written. A plot that fails is logged: the run's
// report matters more than its pictures.
func writePlots(logger klog.Logger, report string, cfg bench.Config, results []*bench.Result, goBench string) (burst, cost string) {
	write := func(suffix string, c plot.Chart, ok bool) string {
		if !ok {
			return ""
		}
		path := report + suffix
		if err := writeChart(path, c); err != nil {
			logger.Error(err, "Plot not written", "path", path)
			return ""
		}
		logger.Info("Plot written", "path", path)
		return filepath.Base(path)
	}
	c, ok := bench.BurstChart(cfg, results)
	burst = write("-burst.svg", c, ok)
	c, ok = bench.CostChart(goBench)
	cost = write("-cost.svg", c, ok)
	return burst, cost
}

func writeChart(path string, c plot.Chart) error {
	svg, err := c.SVG()
	if err != nil {
		return fmt.Errorf("draw %s: %w", path, err)
	}
	if err := os.WriteFile(path, svg, 0o644); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}
