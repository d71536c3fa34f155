package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Meta describes the run for the report.
type Meta struct {
	Date     time.Time
	Command  string
	Machine  []string // "cores: 2", ...
	Versions []string
	Notes    []string
	// GoBench is the output of the Go benchmarks, if they ran.
	GoBench string
	// BurstPlot and CostPlot are the plots written beside the report
	// (BurstChart, CostChart), relative to it; empty when not written.
	BurstPlot, CostPlot string
}

// WriteReport writes the Markdown report of results (the first two are
// compared: ratio = first / second).
func WriteReport(out io.Writer, cfg Config, meta Meta, results []*Result) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Attach/detach benchmark, size %s (%s)\n\n", cfg.Size, meta.Date.Format("2006-01-02 15:04 MST"))
	who := "both controllers"
	if len(results) == 1 {
		who = results[0].Controller.Title + " only"
	}
	churn := fmt.Sprintf("%d churn rounds of %d pods", cfg.ChurnRounds, cfg.Nodes)
	if cfg.LastPhase != "" && slices.Index(Phases, cfg.LastPhase) < slices.Index(Phases, PhaseChurn) {
		churn = "no churn"
	}
	fmt.Fprintf(&b, "%d nodes x %d pods = %d volumes (bound ReadWriteOnce CSI PVs), `--kube-api-qps=%g --kube-api-burst=%d` for %s, idle %s, %s.\n\n",
		cfg.Nodes, cfg.PodsPerNode, cfg.Nodes*cfg.PodsPerNode, cfg.QPS, cfg.Burst, who, cfg.Idle, churn)
	if cfg.LastPhase != "" {
		fmt.Fprintf(&b, "Phases run: up to %s; the rest were not run (-last-phase).\n\n", cfg.LastPhase)
	}
	b.WriteString("Command: `" + meta.Command + "`\n\n")
	b.WriteString("Machine: " + strings.Join(meta.Machine, "; ") + "\n\n")
	b.WriteString("Versions: " + strings.Join(meta.Versions, "; ") + "\n\n")

	writeSummary(&b, cfg, results)
	if meta.BurstPlot != "" {
		fmt.Fprintf(&b, "![Burst: volumes in node status and VolumeAttachments attached over time](%s)\n\n", meta.BurstPlot)
		b.WriteString("The burst over time: solid, the volumes listed in their node's `status.volumesAttached` (what a pod waits for); dashed, the VolumeAttachments attached; sampled every " +
			cfg.Poll.String() + ".\n\n")
	}
	writeRequests(&b, results)
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(&b, "**%s failed**: %s\n\n", r.Controller.Title, r.Err)
		}
	}
	b.WriteString("## Method\n\n")
	for _, n := range meta.Notes {
		b.WriteString("- " + n + "\n")
	}
	b.WriteString("\n")
	if meta.GoBench != "" {
		b.WriteString("## Go benchmarks (caches and per-key decision, 100,000 volumes)\n\n")
		if meta.CostPlot != "" {
			fmt.Fprintf(&b, "![Cost of one event at each cluster size](%s)\n\n", meta.CostPlot)
			b.WriteString("The controller's work for one event (`BenchmarkCost*` below, µs per op) at each cluster size measured: a flat line is a cost that does not grow with the cluster.\n\n")
		}
		b.WriteString("```\n")
		b.WriteString(strings.TrimSpace(meta.GoBench))
		b.WriteString("\n```\n")
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// row is one line of the summary: a value per controller, and a floor.
type row struct {
	label    string
	value    func(r *Result) (float64, bool)
	floor    time.Duration
	hasFloor bool
	unit     string // "s", "MiB", "" (count)
	// totalOf, when set, adds the phase's total request count in brackets.
	totalOf string
}

func writeSummary(b *strings.Builder, cfg Config, results []*Result) {
	f := cfg.Floors()
	v, n := cfg.Nodes*cfg.PodsPerNode, cfg.Nodes
	rounds := time.Duration(cfg.ChurnRounds)
	moveTarget := MoveTarget + cfg.AttachDelay
	streamFloor := f.Teardown(cfg.StreamTeardown, min(cfg.StreamTeardown, n))
	rows := []row{
		{label: "burst: the harness has created every pod", value: phaseTime(PhaseBurst, MPodsWritten), unit: "s"},
		{label: "burst: every VolumeAttachment exists", value: phaseTime(PhaseBurst, MExist), floor: f.BurstCreates(v), hasFloor: true, unit: "s"},
		{label: "burst: every VolumeAttachment attached", value: phaseTime(PhaseBurst, MAttached), floor: f.BurstCreates(v), hasFloor: true, unit: "s"},
		{label: "burst: half the volumes in node.status (a pod's median wait for its volume)", value: phaseTime(PhaseBurst, MHalf), unit: "s"},
		{label: "burst: every volume in node.status.volumesAttached", value: phaseTime(PhaseBurst, MStatus), floor: f.BurstStatus(v, n), hasFloor: true, unit: "s"},
		{label: "burst: last API request, events included", value: lastRequest(PhaseBurst), unit: "s"},
		{label: "burst: API writes, events excluded (all requests)", value: writes(PhaseBurst), totalOf: PhaseBurst},
		{label: "burst: CPU seconds", value: cpu(PhaseBurst), unit: "s"},
		{label: fmt.Sprintf("idle %s: CPU seconds", cfg.Idle), value: cpu(PhaseIdle), unit: "s"},
		{label: "idle: RSS at end (VmRSS)", value: rss(PhaseIdle, false), unit: "MiB"},
		{label: "idle: RSS per volume", value: rssPerVolume(v), unit: "KiB"},
		{label: "peak RSS of the run (VmHWM, both processes of the restart)", value: peakRSS, unit: "MiB"},
		{label: "idle: API requests", value: total(PhaseIdle)},
		{label: "restart: SIGTERM to exit", value: phaseTime(PhaseRestart, MStopped), unit: "s"},
		{label: "restart: ready, from the new process's start (ours: /readyz; kcm: caches synced)", value: phaseTime(PhaseRestart, MReady), unit: "s"},
		{label: "restart: a volume created at the start attached and in node.status, from the start", value: phaseTime(PhaseRestart, MFirstAttach), unit: "s"},
		{label: "restart: the floor, bare informers of the same kinds listing everything (before the stop)", value: phaseTime(PhaseRestart, MListFloor), unit: "s"},
		{label: "restart: ready / that floor", value: phaseRatio(PhaseRestart, MReady, MListFloor), unit: "x"},
		{label: "restart: the new volume attached / that floor", value: phaseRatio(PhaseRestart, MFirstAttach, MListFloor), unit: "x"},
		{label: "restart: CPU seconds of the bare informers' list", value: phaseTime(PhaseRestart, MListCPU), unit: "s"},
		{label: "restart: CPU seconds of kube-apiserver and etcd during the bare list", value: phaseTime(PhaseRestart, MListServerCPU), unit: "s"},
		{label: "restart: CPU seconds of kube-apiserver and etcd from the new process's start until it was ready", value: phaseTime(PhaseRestart, MReadyServerCPU), unit: "s"},
		{label: "restart: API writes but the new volume's, events excluded (all requests)", value: writes(PhaseRestart), totalOf: PhaseRestart},
		{label: "restart: the new volume's writes (attach, detach, node status)", value: writes(WindowNewVolume)},
		{label: "restart: CPU seconds of the new process", value: cpu(PhaseRestart), unit: "s"},
		{label: "restart: peak RSS of the new process (VmHWM)", value: rss(PhaseRestart, true), unit: "MiB"},
		{label: "churn: the harness has deleted and created the pods (sum)", value: phaseTime(PhaseChurn, MPodsWritten), unit: "s"},
		{label: fmt.Sprintf("churn: %d rounds converged (sum)", cfg.ChurnRounds), value: phaseTime(PhaseChurn, MDone), floor: rounds * f.ChurnRound(n, n), hasFloor: true, unit: "s"},
		{label: "churn: slowest round", value: slowestRound, floor: f.ChurnRound(n, n), hasFloor: true, unit: "s"},
		{label: "churn: slowest round, against the floor of writing each change at once (2 status patches a node)", value: slowestRound, floor: f.ChurnRoundPrompt(n, n), hasFloor: true, unit: "s"},
		{label: "churn: last API request, events included (sum)", value: lastRequest(PhaseChurn), unit: "s"},
		{label: "churn: API writes, events excluded (all requests)", value: writes(PhaseChurn), totalOf: PhaseChurn},
		{label: "churn: CPU seconds", value: cpu(PhaseChurn), unit: "s"},
		{label: fmt.Sprintf("move: the harness has created the burst's %d pods", cfg.MoveBurst), value: phaseTime(PhaseMove, MPodsWritten), unit: "s"},
		{label: fmt.Sprintf("move: %d ReadWriteOnce volumes moved to another node right after the burst, old node's unmount to new node's status.volumesAttached: median (target %s: %s + the attacher's %s)",
			cfg.MoveVolumes, seconds(moveTarget), seconds(MoveTarget), cfg.AttachDelay), value: waitMedian(PhaseMove, WaitMove), unit: "s"},
		{label: fmt.Sprintf("move: slowest of the %d (target %s)", cfg.MoveVolumes, seconds(moveTarget)), value: waitMax(PhaseMove, WaitMove), unit: "s"},
		{label: "move: the burst's volumes and the moved ones attached and in node.status, from the burst's first pod", value: phaseTime(PhaseMove, MDone), unit: "s"},
		{label: "move: API writes, the burst's removal included, events excluded (all requests)", value: writes(PhaseMove), totalOf: PhaseMove},
		{label: fmt.Sprintf("stream: %d volumes torn down alone, every VolumeAttachment gone", cfg.StreamTeardown),
			value: phaseTime(PhaseStream, MTeardownAlone), floor: streamFloor, hasFloor: true, unit: "s"},
		{label: fmt.Sprintf("stream: the same teardown while new pods arrive, %g a second", cfg.StreamRate),
			value: phaseTime(PhaseStream, MTeardownStream), floor: streamFloor, hasFloor: true, unit: "s"},
		{label: fmt.Sprintf("stream: teardown under the stream / alone (target %.2f at most)", StreamTarget),
			value: phaseRatio(PhaseStream, MTeardownStream, MTeardownAlone), unit: "x"},
		{label: "stream: new pods created during the teardown", value: waitCount(PhaseStream, WaitStream)},
		{label: "stream: a new pod's wait for its volume in node.status, from its creation: median", value: waitMedian(PhaseStream, WaitStream), unit: "s"},
		{label: "stream: a new pod's wait: slowest", value: waitMax(PhaseStream, WaitStream), unit: "s"},
		{label: "stream: API writes, both teardowns and the pods' setup and removal, events excluded (all requests)", value: writes(PhaseStream), totalOf: PhaseStream},
		{label: "teardown: the harness has deleted every pod", value: phaseTime(PhaseTeardown, MPodsWritten), unit: "s"},
		{label: "teardown: every VolumeAttachment gone (but the new pod's)", value: phaseTime(PhaseTeardown, MGone), floor: f.Teardown(v, n), hasFloor: true, unit: "s"},
		{label: "teardown: node statuses empty (but the new pod's volume)", value: phaseTime(PhaseTeardown, MStatus), unit: "s"},
		{label: fmt.Sprintf("teardown: a new pod's VolumeAttachment attached while the other %d volumes detach, from the pod's creation", v),
			value: phaseTime(PhaseTeardown, MNewPodAttached), unit: "s"},
		{label: "teardown: that volume in node.status too (what the pod waits for), from the pod's creation",
			value: phaseTime(PhaseTeardown, MNewPodReported), unit: "s"},
		{label: "teardown: last API request, events included", value: lastRequest(PhaseTeardown), unit: "s"},
		{label: "teardown: API writes but the new pod's volume's, events excluded (all requests)", value: writes(PhaseTeardown), totalOf: PhaseTeardown},
		{label: "teardown: the new pod's volume's writes (attach, node status)", value: writes(WindowTeardownNewVolume)},
		{label: "teardown: CPU seconds", value: cpu(PhaseTeardown), unit: "s"},
		{label: "startup: canary attached and detached", value: phaseTime(PhaseStartup, MDone), unit: "s"},
	}
	b.WriteString("| metric |")
	for _, r := range results {
		b.WriteString(" " + r.Controller.Title + " |")
	}
	compare := len(results) >= 2
	if compare {
		fmt.Fprintf(b, " ratio %s/%s |", results[0].Controller.Name, results[1].Controller.Name)
	}
	fmt.Fprintf(b, " API floor | %s/floor |\n|---|", results[0].Controller.Name)
	for range results {
		b.WriteString("---:|")
	}
	if compare {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|\n")
	for _, rw := range rows {
		b.WriteString("| " + rw.label + " |")
		vals := make([]float64, len(results))
		oks := make([]bool, len(results))
		for i, r := range results {
			vals[i], oks[i] = rw.value(r)
			b.WriteString(" " + cell(rw, r, vals[i], oks[i]) + " |")
		}
		if compare {
			b.WriteString(" " + ratio(vals[0], oks[0], vals[1], oks[1]) + " |")
		}
		if rw.hasFloor {
			fmt.Fprintf(b, " %.1f | %s |\n", rw.floor.Seconds(), ratio(vals[0], oks[0], rw.floor.Seconds(), true))
		} else {
			b.WriteString(" | |\n")
		}
	}
	b.WriteString("\n")
}

func cell(rw row, r *Result, v float64, ok bool) string {
	if !ok {
		return "—"
	}
	switch rw.unit {
	case "s":
		return fmt.Sprintf("%.1f", v)
	case "MiB":
		return fmt.Sprintf("%.0f MiB", v)
	case "KiB":
		return fmt.Sprintf("%.1f KiB", v)
	case "x":
		return fmt.Sprintf("%.2f", v)
	}
	if rw.totalOf != "" {
		return fmt.Sprintf("%.0f (%d)", v, r.Requests.Total(rw.totalOf))
	}
	return fmt.Sprintf("%.0f", v)
}

func ratio(a float64, aok bool, b float64, bok bool) string {
	if !aok || !bok || b == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

func phaseOK(r *Result, phase string) (*PhaseResult, bool) {
	p := r.Phases[phase]
	return p, p != nil && p.Err == nil
}

func phaseTime(phase, milestone string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		p, ok := phaseOK(r, phase)
		if !ok {
			return 0, false
		}
		t, ok := p.Times[milestone]
		return t.Seconds(), ok
	}
}

// seconds writes d as the report's times are written.
func seconds(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// phaseRatio is milestone a over milestone b of phase.
func phaseRatio(phase, a, b string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		ta, aok := phaseTime(phase, a)(r)
		tb, bok := phaseTime(phase, b)(r)
		if !aok || !bok || tb == 0 {
			return 0, false
		}
		return ta / tb, true
	}
}

func waits(r *Result, phase, name string) ([]time.Duration, bool) {
	p, ok := phaseOK(r, phase)
	if !ok || len(p.Waits[name]) == 0 {
		return nil, false
	}
	return p.Waits[name], true
}

func waitCount(phase, name string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		w, ok := waits(r, phase, name)
		return float64(len(w)), ok
	}
}

func waitMax(phase, name string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		w, ok := waits(r, phase, name)
		if !ok {
			return 0, false
		}
		return slices.Max(w).Seconds(), true
	}
}

// waitMedian is the median of the waits: the middle one, or the mean of
// the two middle ones.
func waitMedian(phase, name string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		w, ok := waits(r, phase, name)
		if !ok {
			return 0, false
		}
		s := slices.Sorted(slices.Values(w))
		m := len(s) / 2
		if len(s)%2 == 0 {
			return (s[m-1] + s[m]).Seconds() / 2, true
		}
		return s[m].Seconds(), true
	}
}

func lastRequest(phase string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		p, ok := phaseOK(r, phase)
		if !ok {
			return 0, false
		}
		return p.LastRequest.Seconds(), true
	}
}

func slowestRound(r *Result) (float64, bool) {
	p, ok := phaseOK(r, PhaseChurn)
	if !ok || len(p.Rounds) == 0 {
		return 0, false
	}
	return slices.Max(p.Rounds).Seconds(), true
}

func cpu(phase string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		p, ok := phaseOK(r, phase)
		if !ok {
			return 0, false
		}
		return p.CPUSeconds(), true
	}
}

func rss(phase string, peak bool) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		p, ok := phaseOK(r, phase)
		if !ok {
			return 0, false
		}
		if peak {
			return float64(p.After.HWMKiB) / 1024, true
		}
		return float64(p.After.RSSKiB) / 1024, true
	}
}

func rssPerVolume(volumes int) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		p, ok := phaseOK(r, PhaseIdle)
		if !ok || volumes == 0 {
			return 0, false
		}
		return float64(p.After.RSSKiB) / float64(volumes), true
	}
}

func peakRSS(r *Result) (float64, bool) {
	if r.PeakKiB == 0 {
		return 0, false
	}
	return float64(r.PeakKiB) / 1024, true
}

func total(phase string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		if _, ok := phaseOK(r, phase); !ok || r.Requests == nil {
			return 0, false
		}
		return float64(r.Requests.Total(phase)), true
	}
}

// windowPhase is the phase each window within a phase is part of.
var windowPhase = map[string]string{WindowNewVolume: PhaseRestart, WindowTeardownNewVolume: PhaseTeardown}

func writes(phase string) func(*Result) (float64, bool) {
	return func(r *Result) (float64, bool) {
		of := phase
		if p, ok := windowPhase[phase]; ok {
			of = p
		}
		if _, ok := phaseOK(r, of); !ok || r.Requests == nil {
			return 0, false
		}
		return float64(r.Requests.Writes(phase, false)), true
	}
}

// writeRequests writes every request kind per phase and controller.
func writeRequests(b *strings.Builder, results []*Result) {
	kinds := map[string]bool{}
	for _, r := range results {
		for _, byKind := range r.Requests {
			for k := range byKind {
				kinds[k] = true
			}
		}
	}
	if len(kinds) == 0 {
		return
	}
	sorted := make([]string, 0, len(kinds))
	for k := range kinds {
		sorted = append(sorted, k)
	}
	slices.SortFunc(sorted, func(a, b string) int {
		va, ra, _ := strings.Cut(a, " ")
		vb, rb, _ := strings.Cut(b, " ")
		if c := strings.Compare(ra, rb); c != 0 {
			return c
		}
		return strings.Compare(va, vb)
	})
	var windows []string
	for _, ph := range Phases {
		windows = append(windows, ph)
		switch ph {
		case PhaseRestart:
			windows = append(windows, WindowNewVolume)
		case PhaseTeardown:
			windows = append(windows, WindowTeardownNewVolume)
		}
	}
	b.WriteString("### API requests by phase (from the apiserver's audit log)\n\n| request |")
	for _, ph := range windows {
		for _, r := range results {
			fmt.Fprintf(b, " %s %s |", ph, r.Controller.Name)
		}
	}
	b.WriteString("\n|---|")
	for range windows {
		for range results {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, k := range sorted {
		b.WriteString("| " + k + " |")
		for _, ph := range windows {
			for _, r := range results {
				if n := r.Requests[ph][k]; n > 0 {
					fmt.Fprintf(b, " %d |", n)
				} else {
					b.WriteString(" |")
				}
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("| **total** |")
	for _, ph := range windows {
		for _, r := range results {
			fmt.Fprintf(b, " **%d** |", r.Requests.Total(ph))
		}
	}
	b.WriteString("\n\n")
}
