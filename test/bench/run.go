package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Phase names, in order.
const (
	PhaseStartup  = "startup"
	PhaseBurst    = "burst"
	PhaseIdle     = "idle"
	PhaseRestart  = "restart"
	PhaseChurn    = "churn"
	PhaseMove     = "move"
	PhaseStream   = "stream"
	PhaseTeardown = "teardown"
)

// Phases lists the phases in order.
var Phases = []string{PhaseStartup, PhaseBurst, PhaseIdle, PhaseRestart, PhaseChurn, PhaseMove, PhaseStream, PhaseTeardown}

// WindowNewVolume counts, within the restart phase, the requests on the
// volume created at the restart (its VolumeAttachment, its node's status):
// what is left of the restart's requests is what starting cost.
const WindowNewVolume = "restart (new volume)"

// WindowTeardownNewVolume counts, within the teardown phase, the requests on
// the volume whose pod is created once every other pod is deleted: what is
// left of the teardown's requests is what the teardown cost.
const WindowTeardownNewVolume = "teardown (new volume)"

// Milestones measured.
const (
	MExist    = "exist"    // every expected VolumeAttachment exists
	MAttached = "attached" // and is attached
	MStatus   = "status"   // node statuses list exactly the expected volumes
	MGone     = "gone"     // no VolumeAttachment left that is not expected
	MHalf     = "half"     // half the expected volumes are listed in their node's status: a pod's median wait
	MDone     = "done"     // all of them

	MPodsWritten = "pods written" // the harness has made every pod write of the phase (its load, not the controller's work)

	MStopped     = "stopped"      // restart: the old process exited after SIGTERM
	MReady       = "ready"        // restart: the new process is ready
	MFirstAttach = "first attach" // restart: the volume created at its start attached and in node.status
	MListFloor   = "list floor"   // restart: bare informers of the same kinds have listed everything (ListEverything)
	MListCPU     = "list cpu"     // restart: the CPU time of that list
	// restart: the CPU time kube-apiserver and etcd used during that list,
	// and from the new process's start until it was ready
	MListServerCPU  = "list server cpu"
	MReadyServerCPU = "ready server cpu"

	// teardown: the volume of a pod created once every other pod is deleted
	MNewPodAttached = "new pod attached" // its VolumeAttachment attached
	MNewPodReported = "new pod reported" // and in node.status: what the pod waits for
)

var (
	milestoneExist    = Milestone{MExist, Snapshot.AllExist}
	milestoneAttached = Milestone{MAttached, func(s Snapshot) bool { return s.Attached == s.Expected }}
	milestoneStatus   = Milestone{MStatus, Snapshot.StatusExact}
	// A pod's volume is usable once its node's status lists it (kubelet
	// waits for that): the median of that wait over a burst.
	milestoneHalfReported = Milestone{MHalf, func(s Snapshot) bool { return 2*s.Reported >= s.Expected }}
	milestoneGone         = Milestone{MGone, Snapshot.NoExtra}
	milestoneDone         = Milestone{MDone, Snapshot.Converged}
)

// Config is one benchmark run.
type Config struct {
	Size        string
	Nodes       int
	PodsPerNode int
	QPS         float32
	Burst       int
	ChurnRounds int
	// The move phase: MoveVolumes of the workload's volumes move to
	// another node right after a burst of MoveBurst new pods; each attach
	// of the phase takes AttachDelay.
	MoveVolumes, MoveBurst int
	AttachDelay            time.Duration
	// The stream phase: StreamTeardown volumes torn down alone, then while
	// new pods arrive at StreamRate a second.
	StreamTeardown int
	StreamRate     float64
	// Idle is the length of the idle phase.
	Idle time.Duration
	// After each phase (and churn round) the harness waits until the
	// controller has made no API request for Quiet, at most MaxSettle: the
	// trailing work (events) counts for the phase, not for the next one,
	// and the token bucket is full again.
	Quiet, MaxSettle time.Duration
	// A phase times out after TimeoutFactor x its floor, at least MinTimeout.
	TimeoutFactor float64
	MinTimeout    time.Duration
	// Poll is how often the harness compares the cluster with what it
	// expects: the resolution of the times measured.
	Poll   time.Duration
	Driver string
	// WorkDir keeps the logs, the audit log and the metrics of the run.
	WorkDir string
	// LastPhase, when set, is the last phase run (Phases): a huge run that
	// measures the restart stops there, its cluster discarded.
	LastPhase string
	// ListFloor, when set, is a command (and its arguments, to which
	// "-kubeconfig <path>" is added) that lists what the controller reads
	// with bare informers and prints its ListStats as JSON: the restart
	// phase runs it before the stop, for the restart's floor.
	ListFloor []string
}

// Floors of the run's API budget.
func (c Config) Floors() Floors { return Floors{QPS: float64(c.QPS), Burst: c.Burst} }

func (c Config) timeout(floor time.Duration) time.Duration {
	return max(c.MinTimeout, time.Duration(c.TimeoutFactor*float64(floor)))
}

// Env is what every controller's run shares.
type Env struct {
	Cluster  *framework.Cluster
	Client   kubernetes.Interface // unthrottled, for setup and load
	Observer *Observer
	// Attacher is the test attacher, whose attach delay a phase may set.
	Attacher *Attacher
	AuditLog string
	Config   Config
	// LeaveWorkload skips the cleanup after the run: the cluster goes away
	// with it.
	LeaveWorkload bool
}

// PhaseResult is what one phase measured.
type PhaseResult struct {
	Start, End time.Time
	// Times are the milestones reached, from the start of the phase; for
	// churn, summed over the rounds.
	Times map[string]time.Duration
	// Rounds are the churn rounds' times to converge.
	Rounds []time.Duration
	// Waits are waits measured one by one (WaitMove, WaitStream), in the
	// order they were made.
	Waits map[string][]time.Duration
	// Progress is the burst's counts over time, from the start of the
	// phase, for the report's plot.
	Progress *Progress
	// LastRequest is when the controller's last request of the phase
	// (events included) was seen, from the start of the phase; for churn,
	// summed over the rounds.
	LastRequest   time.Duration
	Before, After framework.Stats
	Err           error
}

func (p *PhaseResult) addWait(name string, d time.Duration) {
	if p.Waits == nil {
		p.Waits = map[string][]time.Duration{}
	}
	p.Waits[name] = append(p.Waits[name], d)
}

// CPUSeconds is the CPU time the controller used during the phase.
func (p *PhaseResult) CPUSeconds() float64 {
	return framework.CPUSeconds(p.After.CPUTicks - p.Before.CPUTicks)
}

// Result is one controller's run.
type Result struct {
	Controller Controller
	Phases     map[string]*PhaseResult
	Requests   Requests
	// PeakKiB is the highest VmHWM of the run, the process stopped by the
	// restart phase included.
	PeakKiB int64
	// Err is the first failure; the phases after it did not run.
	Err     error
	LogPath string
}

func (r *Result) peak(s framework.Stats) { r.PeakKiB = max(r.PeakKiB, s.HWMKiB) }

// Run runs every phase for one controller on a fresh workload, then
// removes the workload. It never returns with the controller running.
func Run(ctx context.Context, env *Env, ctrl Controller) *Result {
	logger := klog.FromContext(ctx).WithValues("controller", ctrl.Name)
	ctx = klog.NewContext(ctx, logger)
	cfg := env.Config
	res := &Result{Controller: ctrl, Phases: map[string]*PhaseResult{}}
	w := NewWorkload(ctrl.Name, cfg.Driver, cfg.Nodes, cfg.PodsPerNode)

	started := time.Now()
	logger.Info("Creating nodes and bound volumes", "nodes", w.Nodes, "volumes", w.Volumes())
	if err := w.Setup(ctx, env.Client); err != nil {
		res.Err = fmt.Errorf("setup: %w", err)
		cleanup(ctx, env, w)
		return res
	}
	logger.Info("Setup done", "duration", time.Since(started).Round(time.Millisecond))
	id, err := NewIdentity(ctx, env.Cluster, cfg.WorkDir, ctrl.Name)
	if err != nil {
		res.Err = err
		cleanup(ctx, env, w)
		return res
	}
	args, ep, err := ctrl.Args(id.Kubeconfig, cfg.QPS, cfg.Burst)
	if err != nil {
		res.Err = err
		cleanup(ctx, env, w)
		return res
	}
	// A crash of the controller ends the phase under way at once.
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := &runner{env: env, cfg: cfg, w: w, ctrl: ctrl, args: args, ep: ep, res: res, cancel: cancel, logger: logger}
	res.LogPath = filepath.Join(cfg.WorkDir, ctrl.Name+".log")
	if err := r.start(runCtx, res.LogPath); err != nil {
		res.Err = err
		cleanup(ctx, env, w)
		return res
	}
	procStart := time.Now()
	logger.Info("Controller started", "pid", r.proc.Pid(), "log", res.LogPath)
	r.phases(runCtx)
	end := time.Now()
	cancel(nil)
	_ = r.proc.Stop(stopTimeout)

	windows := []Window{}
	for _, name := range Phases {
		p := res.Phases[name]
		if p == nil {
			continue
		}
		// First: a request on a new volume's objects counts there.
		switch name {
		case PhaseRestart:
			windows = append(windows, Window{Name: WindowNewVolume, Start: p.Start, End: p.End, Objects: w.NewVolumeObjects(RestartVolume)})
		case PhaseTeardown:
			windows = append(windows, Window{Name: WindowTeardownNewVolume, Start: p.Start, End: p.End, Objects: w.NewVolumeObjects(TeardownVolume)})
		}
		windows = append(windows, Window{Name: name, Start: p.Start, End: p.End})
	}
	if len(windows) > 0 {
		windows[0].Start = procStart
		windows[len(windows)-1].End = end
	}
	// The audit log is written before each response: every request is in.
	if res.Requests, err = CountRequests(env.AuditLog, id.User, windows); err != nil && res.Err == nil {
		res.Err = err
	}
	if env.LeaveWorkload {
		logger.Info("Workload left in place: the cluster goes away with it")
	} else {
		cleanup(ctx, env, w)
	}
	return res
}

// runner runs the phases of one controller.
type runner struct {
	env    *Env
	cfg    Config
	w      *Workload
	ctrl   Controller
	args   []string
	ep     Endpoints
	proc   *framework.Process
	res    *Result
	cancel context.CancelCauseFunc
	logger klog.Logger
}

// start starts the controller, its output in logPath. An exit that Stop did
// not ask for ends the phase under way at once.
func (r *runner) start(ctx context.Context, logPath string) error {
	proc, err := framework.StartLogged(r.ctrl.Name, logPath, r.ctrl.Binary, r.args...)
	if err != nil {
		return err
	}
	r.proc = proc
	go func() {
		select {
		case <-proc.Done():
			if !proc.Stopped() {
				r.cancel(fmt.Errorf("%s exited: %w (log: %s)", r.ctrl.Name, proc.ExitError(), logPath))
			}
		case <-ctx.Done():
		}
	}()
	return nil
}

func (r *runner) phases(ctx context.Context) {
	steps := []struct {
		name string
		run  func(context.Context, *PhaseResult) error
	}{
		{PhaseStartup, r.startup},
		{PhaseBurst, r.burst},
		{PhaseIdle, r.idle},
		{PhaseRestart, r.restart},
		{PhaseChurn, r.churn},
		{PhaseMove, r.move},
		{PhaseStream, r.stream},
		{PhaseTeardown, r.teardown},
	}
	var prev *PhaseResult
	for _, s := range steps {
		p := &PhaseResult{Times: map[string]time.Duration{}}
		r.res.Phases[s.name] = p
		p.Start = time.Now()
		if prev != nil {
			// Windows are contiguous: a request made while settling counts
			// for the phase before.
			prev.End = p.Start
		}
		var err error
		if p.Before, err = r.proc.Stats(); err == nil {
			r.logger.Info("Phase", "phase", s.name)
			err = s.run(ctx, p)
		}
		if st, serr := r.proc.Stats(); serr == nil {
			p.After = st
		} else {
			err = errors.Join(err, serr)
		}
		p.End = time.Now()
		r.res.peak(p.Before)
		r.res.peak(p.After)
		r.saveMetrics(ctx, s.name)
		if err != nil {
			p.Err = fmt.Errorf("%s: %w", s.name, err)
			r.res.Err = p.Err
			r.logger.Error(err, "Phase failed", "phase", s.name)
			return
		}
		r.logger.Info("Phase done", "phase", s.name, "times", p.Times, "cpuSeconds", p.CPUSeconds(), "rssMiB", p.After.RSSKiB/1024)
		prev = p
		if s.name == r.cfg.LastPhase {
			return
		}
	}
}

// startup waits until the controller has attached and detached the canary
// volume: its caches are synced and it acts.
func (r *runner) startup(ctx context.Context, p *PhaseResult) error {
	const timeout = 3 * time.Minute
	if err := r.w.CreateCanary(ctx, r.env.Client); err != nil {
		return err
	}
	if _, err := r.env.Observer.Await(ctx, r.w.CanaryExpect(true), p.Start, timeout, milestoneDone); err != nil {
		return fmt.Errorf("canary volume not attached: %w", err)
	}
	if err := r.w.DeleteCanary(ctx, r.env.Client); err != nil {
		return err
	}
	t, err := r.env.Observer.Await(ctx, r.w.CanaryExpect(false), p.Start, timeout, milestoneDone)
	if err != nil {
		return fmt.Errorf("canary volume not detached: %w", err)
	}
	p.Times[MDone] = t[MDone]
	_, err = r.settle(ctx, p.Start)
	return err
}

func (r *runner) burst(ctx context.Context, p *PhaseResult) error {
	f := r.cfg.Floors()
	exp := r.w.Expect(r.w.All())
	// Observed from the first pod write: half the volumes may be reported
	// before the harness has written the last pod.
	p.Progress = &Progress{}
	result, cancelAwait := r.env.Observer.AwaitAsync(ctx, exp, p.Start, r.cfg.timeout(f.BurstStatus(r.w.Volumes(), r.w.Nodes)), p.Progress,
		milestoneExist, milestoneAttached, milestoneHalfReported, milestoneStatus, milestoneDone)
	defer cancelAwait()
	if err := r.w.CreatePods(ctx, r.env.Client, r.w.All()); err != nil {
		cancelAwait()
		_, _ = result()
		return err
	}
	written := time.Since(p.Start)
	r.logger.Info("Pods created", "pods", r.w.Volumes(), "after", written.Round(time.Millisecond))
	times, err := result()
	p.Times = times
	p.Times[MPodsWritten] = written
	if err != nil {
		return err
	}
	p.LastRequest, err = r.settle(ctx, p.Start)
	return err
}

func (r *runner) idle(ctx context.Context, p *PhaseResult) error {
	if err := pause(ctx, r.cfg.Idle); err != nil {
		return err
	}
	// Nothing may have moved meanwhile.
	if s := r.env.Observer.Snapshot(r.w.Expect(r.w.All())); !s.Converged() {
		return fmt.Errorf("state changed while idle: %s", s)
	}
	return nil
}

func (r *runner) churn(ctx context.Context, p *PhaseResult) error {
	f := r.cfg.Floors()
	for round := 1; round <= r.cfg.ChurnRounds; round++ {
		set := r.w.ChurnSet(round - 1)
		start := time.Now()
		if err := r.w.DeletePods(ctx, r.env.Client, set); err != nil {
			return err
		}
		r.w.Move(set, round)
		if err := r.w.CreatePods(ctx, r.env.Client, set); err != nil {
			return err
		}
		p.Times[MPodsWritten] += time.Since(start)
		t, err := r.env.Observer.Await(ctx, r.w.Expect(r.w.All()), start, r.cfg.timeout(f.ChurnRound(len(set), r.w.Nodes)),
			milestoneGone, milestoneStatus, milestoneDone)
		if err != nil {
			return fmt.Errorf("round %d: %w", round, err)
		}
		for k, v := range t {
			p.Times[k] += v
		}
		p.Rounds = append(p.Rounds, t[MDone])
		last, err := r.settle(ctx, start)
		if err != nil {
			return err
		}
		p.LastRequest += last
		r.logger.Info("Churn round done", "round", round, "moved", len(set), "duration", t[MDone].Round(time.Millisecond))
	}
	return nil
}

// teardown deletes every pod; right after, a pod with a volume of its own
// is created on the canary node. Measured from the first delete: until
// every other VolumeAttachment is gone and every node's status lists
// nothing but the new volume; from the new pod's creation: until its volume
// is attached and in node.status, the wait of a pod scheduled while a
// whole namespace goes. A controller that queued that attach behind the
// detaches would make it wait about as long as the teardown. The new volume
// stays attached: the cleanup removes it.
func (r *runner) teardown(ctx context.Context, p *PhaseResult) error {
	f := r.cfg.Floors()
	timeout := r.cfg.timeout(f.Teardown(r.w.Volumes(), r.w.Nodes))
	// Its claim and PV exist before the clock starts: the pod's wait is
	// measured, not the harness's writes.
	if err := r.w.CreateNewVolumeClaim(ctx, r.env.Client, TeardownVolume); err != nil {
		return err
	}
	start := time.Now()
	if err := r.w.DeletePods(ctx, r.env.Client, r.w.All()); err != nil {
		return err
	}
	written := time.Since(start)
	created := time.Now()
	newPod, cancel := r.env.Observer.AwaitAsync(ctx, r.w.NewVolumeExpect(TeardownVolume, true), created, timeout, nil, milestoneAttached, milestoneDone)
	defer cancel()
	if err := r.w.CreateNewVolumePod(ctx, r.env.Client, TeardownVolume); err != nil {
		return err
	}
	t, err := r.env.Observer.Await(ctx, r.w.TeardownExpect(), start, timeout, milestoneGone, milestoneStatus)
	p.Times = t
	p.Times[MPodsWritten] = written
	if err != nil {
		return err
	}
	nt, err := newPod()
	if err != nil {
		return fmt.Errorf("volume of the pod created during the teardown not attached: %w", err)
	}
	p.Times[MNewPodAttached], p.Times[MNewPodReported] = nt[MAttached], nt[MDone]
	r.logger.Info("Pod created during the teardown attached", "attached", nt[MAttached].Round(time.Millisecond),
		"inNodeStatus", nt[MDone].Round(time.Millisecond), "teardownGone", t[MGone].Round(time.Millisecond))
	p.LastRequest, err = r.settle(ctx, start)
	return err
}

// settle waits until the controller has made no API request for Quiet
// (discovery GETs aside: see auditTail.busy), at most MaxSettle. It returns
// when the last request was seen, from start.
func (r *runner) settle(ctx context.Context, start time.Time) (time.Duration, error) {
	const every = 200 * time.Millisecond
	tail := newAuditTail(r.env.AuditLog)
	changed := time.Now()
	begin := changed
	for {
		if err := pause(ctx, every); err != nil {
			return 0, err
		}
		now := time.Now()
		busy, err := tail.busy()
		if err != nil {
			return 0, err
		}
		if busy {
			changed = now
		}
		if now.Sub(changed) >= r.cfg.Quiet {
			return changed.Sub(start), nil
		}
		if now.Sub(begin) >= r.cfg.MaxSettle {
			r.logger.Info("Controller still busy; going on", "after", r.cfg.MaxSettle)
			return changed.Sub(start), nil
		}
	}
}

// saveMetrics keeps the controller's /metrics after a phase, if it serves
// them.
func (r *runner) saveMetrics(ctx context.Context, phase string) {
	if r.ep.Metrics == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.ep.Metrics, nil)
	if err != nil {
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.logger.Info("Metrics not saved", "err", err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return
	}
	path := filepath.Join(r.cfg.WorkDir, fmt.Sprintf("%s-metrics-%s.txt", r.w.Prefix, phase))
	if err := os.WriteFile(path, body, 0o644); err != nil {
		r.logger.Info("Metrics not saved", "err", err)
	}
}

// cleanup deletes the run's objects, the VolumeAttachments left on its nodes
// by a failed phase included, so that the next controller's caches hold
// only its own workload.
func cleanup(ctx context.Context, env *Env, w *Workload) {
	logger := klog.FromContext(ctx)
	if ctx.Err() != nil {
		return // interrupted: the cluster goes away with everything in it
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Minute)
	defer cancel()
	if err := w.Cleanup(ctx, env.Client); err != nil {
		logger.Error(err, "Cleanup")
	}
	if err := deleteAttachments(ctx, env.Client, w.Driver); err != nil {
		logger.Error(err, "Cleanup")
	}
	if _, err := env.Observer.Await(ctx, w.Expect(nil), time.Now(), 5*time.Minute, milestoneGone); err != nil {
		logger.Error(err, "Cleanup: VolumeAttachments left")
	}
}

// pause waits for d, or until ctx is done.
func pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
