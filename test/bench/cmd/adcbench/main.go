// Command adcbench runs the attach/detach benchmark (package
// test/bench) for this repository's controller and kube-controller-manager,
// side by side on one etcd and kube-apiserver, and writes the Markdown
// report to <results>/<date>-<size>.md (-2, -3... when that exists), with
// its plots beside it: <report>-burst.svg, <report>-cost.svg.
//
//	go run ./test/bench/cmd/adcbench -size small
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/bench"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// size is a workload -size selects: nodes x pods per node, the burst the
// move phase's moves arrive behind, the volumes the stream phase tears
// down.
type size struct {
	nodes, podsPerNode, moveBurst, streamTeardown int
}

var sizes = map[string]size{
	"small": {50, 10, 150, 100},
	"large": {1000, 10, 1000, 1000},
	"huge":  {10000, 10, 1000, 1000},
}

// The defaults of -qps, -burst and -controllers: the budget
// kube-controller-manager's --kube-api-qps / --kube-api-burst default to.
const (
	defaultQPS         = 20
	defaultBurst       = 30
	defaultControllers = "ours,kcm"
)

// The defaults of the move and stream phases' flags.
const (
	defaultMoveVolumes = 5
	defaultAttachDelay = 300 * time.Millisecond
	defaultStreamRate  = 4
)

type flags struct {
	size, controllers, binDir, oursBinary, results, workDir, goBench, lastPhase string
	nodes, podsPerNode, burst, rounds                                           int
	moveVolumes, moveBurst, streamTeardown                                      int
	qps, streamRate                                                             float64
	idle, quiet, maxSettle, minTimeout, poll, attachDelay                       time.Duration
	timeoutFactor                                                               float64
	keep                                                                        bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "list-floor" {
		listFloor(os.Args[2:])
		return
	}
	klog.InitFlags(nil)
	var f flags
	flag.StringVar(&f.size, "size", "small", "workload: small (50 nodes x 10 pods), large (1000 x 10) or huge (10000 x 10)")
	flag.IntVar(&f.nodes, "nodes", 0, "override the number of nodes of -size")
	flag.IntVar(&f.podsPerNode, "pods-per-node", 0, "override the pods per node of -size")
	flag.StringVar(&f.controllers, "controllers", defaultControllers, "controllers to run, in order: ours, kcm")
	flag.Float64Var(&f.qps, "qps", defaultQPS, "--kube-api-qps of both controllers")
	flag.IntVar(&f.burst, "burst", defaultBurst, "--kube-api-burst of both controllers")
	flag.DurationVar(&f.idle, "idle", time.Minute, "length of the idle phase")
	flag.DurationVar(&f.quiet, "quiet", 10*time.Second, "after each phase and churn round, wait until the controller has made no API request for this long...")
	flag.DurationVar(&f.maxSettle, "max-settle", 10*time.Minute, "...but at most this long")
	flag.IntVar(&f.rounds, "churn-rounds", 3, "churn rounds")
	flag.IntVar(&f.moveVolumes, "move-volumes", defaultMoveVolumes, "move phase: ReadWriteOnce volumes in use moved to another node right after a burst of new pods")
	flag.IntVar(&f.moveBurst, "move-burst", 0, "move phase: pods of the burst (default: small 150, large and huge 1000)")
	flag.DurationVar(&f.attachDelay, "attach-delay", defaultAttachDelay, "move phase: how long the test attacher takes to attach (other phases: none)")
	flag.IntVar(&f.streamTeardown, "stream-teardown", 0, "stream phase: volumes torn down alone, then while new pods arrive (default: small 100, large and huge 1000)")
	flag.Float64Var(&f.streamRate, "stream-rate", defaultStreamRate, "stream phase: new pods a second during the second teardown")
	flag.StringVar(&f.lastPhase, "last-phase", "", "stop after this phase ("+strings.Join(bench.Phases, ", ")+"); default: run them all")
	flag.Float64Var(&f.timeoutFactor, "timeout-factor", 6, "a phase fails after this many times its API floor...")
	flag.DurationVar(&f.minTimeout, "min-timeout", 5*time.Minute, "...or after this, whichever is longer")
	flag.DurationVar(&f.poll, "poll", 0, "how often the harness compares the cluster with what it expects (default: 100ms, 500ms from 50,000 volumes on)")
	flag.StringVar(&f.binDir, "bin-dir", "", "directory of etcd, kube-apiserver, kube-controller-manager and attach-detach-controller (default: _output/bin)")
	flag.StringVar(&f.oursBinary, "ours-binary", "", "attach-detach-controller binary (default: in -bin-dir); e.g. one built from test/bench/cmd/adc-pprof")
	flag.StringVar(&f.results, "results", "bench/results", "directory of the report")
	flag.StringVar(&f.workDir, "work-dir", "", "directory of logs, audit log and metrics (default: _output/bench/<time>-<size>)")
	flag.StringVar(&f.goBench, "go-bench", "", "file with `go test -bench` output to include in the report")
	flag.BoolVar(&f.keep, "keep", true, "keep the work directory (audit log, controller logs)")
	flag.Parse()
	if err := run(f); err != nil {
		fmt.Fprintln(os.Stderr, "adcbench:", err)
		os.Exit(1)
	}
}

func run(f flags) error {
	size, ok := sizes[f.size]
	if !ok {
		return fmt.Errorf("-size must be small, large or huge, got %q", f.size)
	}
	if f.lastPhase != "" && !slices.Contains(bench.Phases, f.lastPhase) {
		return fmt.Errorf("-last-phase must be one of %s, got %q", strings.Join(bench.Phases, ", "), f.lastPhase)
	}
	if f.streamRate <= 0 {
		return fmt.Errorf("-stream-rate must be positive, got %g", f.streamRate)
	}
	if f.nodes > 0 {
		size.nodes = f.nodes
	}
	if f.podsPerNode > 0 {
		size.podsPerNode = f.podsPerNode
	}
	if f.moveBurst > 0 {
		size.moveBurst = f.moveBurst
	}
	if f.streamTeardown > 0 {
		size.streamTeardown = f.streamTeardown
	}
	if f.poll <= 0 {
		// Each comparison lists every VolumeAttachment and node: at 100,000
		// volumes, every 100 ms would take a good part of a core from the
		// apiserver.
		f.poll = 100 * time.Millisecond
		if size.nodes*size.podsPerNode >= 50000 {
			f.poll = 500 * time.Millisecond
		}
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if f.binDir == "" {
		f.binDir = filepath.Join(root, "_output", "bin")
	}
	now := time.Now()
	if f.workDir == "" {
		f.workDir = filepath.Join(root, "_output", "bench", now.Format("20060102-150405")+"-"+f.size)
	}
	if err := os.MkdirAll(f.workDir, 0o755); err != nil {
		return fmt.Errorf("create work directory: %w", err)
	}
	if !f.keep {
		defer os.RemoveAll(f.workDir)
	}
	var ctrls []bench.Controller
	for _, name := range strings.Split(f.controllers, ",") {
		switch strings.TrimSpace(name) {
		case "ours":
			bin := f.oursBinary
			if bin == "" {
				bin = filepath.Join(f.binDir, "attach-detach-controller")
			}
			ctrls = append(ctrls, bench.Ours(bin))
		case "kcm":
			ctrls = append(ctrls, bench.KCM(filepath.Join(f.binDir, "kube-controller-manager")))
		default:
			return fmt.Errorf("-controllers: unknown controller %q (ours, kcm)", name)
		}
	}
	for _, c := range ctrls {
		if _, err := os.Stat(c.Binary); err != nil {
			return fmt.Errorf("%s binary: %w (make build; hack/build-tools.sh kube-controller-manager)", c.Name, err)
		}
	}
	cfg := bench.Config{
		Size: f.size, Nodes: size.nodes, PodsPerNode: size.podsPerNode,
		QPS: float32(f.qps), Burst: f.burst, ChurnRounds: f.rounds,
		MoveVolumes: f.moveVolumes, MoveBurst: size.moveBurst, AttachDelay: f.attachDelay,
		StreamTeardown: size.streamTeardown, StreamRate: f.streamRate,
		Idle: f.idle, Quiet: f.quiet, MaxSettle: f.maxSettle,
		TimeoutFactor: f.timeoutFactor, MinTimeout: f.minTimeout, Poll: f.poll,
		Driver: "bench.csi.example.com", WorkDir: f.workDir, LastPhase: f.lastPhase,
	}
	if self, err := os.Executable(); err == nil {
		cfg.ListFloor = []string{self, "list-floor"}
	}
	meta := collectMeta(root, f.binDir, now)
	if f.goBench != "" {
		out, err := os.ReadFile(f.goBench)
		if err != nil {
			return fmt.Errorf("-go-bench: %w", err)
		}
		meta.GoBench = string(out)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)
	results, err := runAll(ctx, f.binDir, cfg, ctrls)
	if err != nil {
		return err
	}
	meta.Notes = notes(cfg, ctrls)
	meta.Machine = append(meta.Machine, "load average at end: "+loadAvg())
	dir := f.results
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(root, dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results directory: %w", err)
	}
	out, err := createReport(dir, now.Format("2006-01-02")+"-"+reportName(f))
	if err != nil {
		return err
	}
	path := out.Name()
	meta.BurstPlot, meta.CostPlot = writePlots(logger, strings.TrimSuffix(path, ".md"), cfg, results, meta.GoBench)
	if err := bench.WriteReport(out, cfg, meta, results); err != nil {
		out.Close()
		return fmt.Errorf("write report: %w", err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	logger.Info("Report written", "path", path, "workDir", f.workDir)
	if err := bench.WriteReport(os.Stdout, cfg, meta, results); err != nil {
		return err
	}
	var errs []error
	for _, r := range results {
		if r.Err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Controller.Name, r.Err))
		}
	}
	return errors.Join(errs...)
}

// reportName names the report after the size, with what differs from the
// size's defaults (nodes, pods per node, API budget), so that runs of one day
// with different settings do not overwrite each other.
func reportName(f flags) string {
	name := f.size
	if f.nodes > 0 {
		name += fmt.Sprintf("-%dnodes", f.nodes)
	}
	if f.podsPerNode > 0 {
		name += fmt.Sprintf("-%dpods", f.podsPerNode)
	}
	if f.qps != defaultQPS || f.burst != defaultBurst {
		name += fmt.Sprintf("-qps%g", f.qps)
		if f.burst != defaultBurst {
			name += fmt.Sprintf("-burst%d", f.burst)
		}
	}
	if f.controllers != defaultControllers {
		name += "-" + strings.ReplaceAll(f.controllers, ",", "-")
	}
	if f.lastPhase != "" {
		name += "-to-" + f.lastPhase
	}
	return name
}

// createReport creates dir/base.md, or, when a report of that name exists,
// base-2.md, base-3.md and so on: a second run of one day with the same
// settings keeps the first one's report to compare with.
func createReport(dir, base string) (*os.File, error) {
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			name += fmt.Sprintf("-%d", i)
		}
		out, err := os.OpenFile(filepath.Join(dir, name+".md"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("create report: %w", err)
		}
		return out, nil
	}
}

// runAll starts the cluster (etcd and kube-apiserver from binDir), the test
// attacher and the observer, runs each controller in turn, and stops
// everything.
func runAll(ctx context.Context, binDir string, cfg bench.Config, ctrls []bench.Controller) ([]*bench.Result, error) {
	logger := klog.FromContext(ctx)
	names := make([]string, 0, len(ctrls))
	for _, c := range ctrls {
		names = append(names, c.Name)
	}
	cluster, auditLog, err := bench.StartCluster(logger, binDir, cfg.WorkDir, names)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	client := func(agent string) (kubernetes.Interface, error) {
		c := rest.CopyConfig(cluster.Config)
		c.UserAgent = agent
		c.QPS = -1
		return kubernetes.NewForConfig(c)
	}
	setup, err := client("adcbench-setup")
	if err != nil {
		return nil, err
	}
	attacherClient, err := client("adcbench-attacher")
	if err != nil {
		return nil, err
	}
	observerClient, err := client("adcbench-observer")
	if err != nil {
		return nil, err
	}
	if _, err := framework.CreateCSIDriver(ctx, setup, cfg.Driver, new(true)); err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	attacher, err := bench.StartAttacher(hctx, attacherClient, cfg.Driver)
	if err != nil {
		return nil, err
	}
	defer attacher.Wait()
	defer cancel()
	observer, err := bench.StartObserver(hctx, observerClient, cfg.Poll)
	if err != nil {
		return nil, err
	}
	defer observer.Stop()
	defer cancel()

	env := &bench.Env{Cluster: cluster, Client: setup, Observer: observer, Attacher: attacher, AuditLog: auditLog, Config: cfg}
	var results []*bench.Result
	for i, c := range ctrls {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("interrupted: %w", err)
		}
		// After the last controller the cluster stops: deleting its
		// workload first (minutes at 100,000 volumes) would be wasted.
		env.LeaveWorkload = i == len(ctrls)-1
		logger.Info("Benchmarking", "controller", c.Title)
		results = append(results, bench.Run(hctx, env, c))
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("interrupted: %w", err)
	}
	return results, nil
}

// moduleRoot is the nearest directory above the working directory with a go.mod.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("find module root: no go.mod above %s", wd)
		}
	}
}

// listFloor is "adcbench list-floor -kubeconfig PATH": bench.ListEverything
// in a process of its own, its ListStats printed as JSON.
func listFloor(args []string) {
	fs := flag.NewFlagSet("list-floor", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster")
	_ = fs.Parse(args)
	err := func() error {
		config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			return err
		}
		s, err := bench.ListEverything(context.Background(), config)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(s)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "adcbench list-floor:", err)
		os.Exit(1)
	}
}
