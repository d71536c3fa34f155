package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// restartTimeout bounds each wait of the restart phase at least; a phase's
// MinTimeout, when longer, bounds it instead.
const restartTimeout = 3 * time.Minute

// restart stops the controller (SIGTERM) on a cluster where everything is
// attached and starts it again. Right after the new process starts, the
// harness creates one more volume (bound PV and claim) and a pod using it on
// the canary node. Measured from the new process's start: until it is
// ready, and until the new volume is attached and in node.status. Then the
// pod goes, the volume is detached, and the harness waits for the
// controller to be quiet. The requests of the restart window, but those on
// the new volume's objects (WindowNewVolume), are what starting cost: with
// everything already right, a restart needs no write.
func (r *runner) restart(ctx context.Context, p *PhaseResult) error {
	timeout := max(restartTimeout, r.cfg.MinTimeout)
	if len(r.cfg.ListFloor) > 0 {
		// The floor first, on the same quiet cluster, the controller idle.
		server0, err := r.serverCPU()
		if err != nil {
			return err
		}
		s, err := r.listFloor(ctx)
		if err != nil {
			return err
		}
		server1, err := r.serverCPU()
		if err != nil {
			return err
		}
		p.Times[MListFloor], p.Times[MListCPU], p.Times[MListServerCPU] = s.Synced, s.CPU, server1-server0
		r.logger.Info("Bare informers listed everything", "objects", s.Objects, "synced", s.Synced.Round(time.Millisecond), "cpu", s.CPU.Round(time.Millisecond),
			"serverCPU", (server1 - server0).Round(time.Millisecond))
	}
	stopping := time.Now()
	_ = r.proc.Stop(stopTimeout)
	p.Times[MStopped] = time.Since(stopping)

	logPath := filepath.Join(r.cfg.WorkDir, r.ctrl.Name+"-restarted.log")
	if err := r.start(ctx, logPath); err != nil {
		return err
	}
	start := time.Now()
	// CPU time from the new process's start; the old one's peak memory is
	// already in the run's peak (Before).
	p.Before = framework.Stats{At: start}
	server0, err := r.serverCPU()
	if err != nil {
		return err
	}
	r.logger.Info("Controller restarted", "pid", r.proc.Pid(), "log", logPath, "stoppedIn", p.Times[MStopped].Round(time.Millisecond))
	if err := r.w.CreateNewVolumeClaim(ctx, r.env.Client, RestartVolume); err != nil {
		return err
	}
	if err := r.w.CreateNewVolumePod(ctx, r.env.Client, RestartVolume); err != nil {
		return err
	}
	// The new volume may be attached before the controller says it is
	// ready: both are awaited from the start, side by side.
	result, cancel := r.env.Observer.AwaitAsync(ctx, r.w.NewVolumeExpect(RestartVolume, true), start, timeout, nil, milestoneDone)
	defer cancel()
	ready, err := r.awaitReady(ctx, logPath, start, timeout)
	if err != nil {
		return err
	}
	p.Times[MReady] = ready
	server1, err := r.serverCPU()
	if err != nil {
		return err
	}
	p.Times[MReadyServerCPU] = server1 - server0
	t, err := result()
	if err != nil {
		return fmt.Errorf("volume created at the restart not attached: %w", err)
	}
	p.Times[MFirstAttach] = t[MDone]
	r.logger.Info("Restarted controller ready", "ready", ready.Round(time.Millisecond), "firstAttach", t[MDone].Round(time.Millisecond))
	if err := r.w.DeleteNewVolumePod(ctx, r.env.Client, RestartVolume); err != nil {
		return err
	}
	if _, err := r.env.Observer.Await(ctx, r.w.NewVolumeExpect(RestartVolume, false), time.Now(), timeout, milestoneDone); err != nil {
		return fmt.Errorf("volume created at the restart not detached: %w", err)
	}
	p.LastRequest, err = r.settle(ctx, p.Start)
	if err != nil {
		return err
	}
	// Nothing else may have moved.
	if s := r.env.Observer.Snapshot(r.w.Expect(r.w.All())); !s.Converged() {
		return fmt.Errorf("state changed by the restart: %s", s)
	}
	return nil
}

// serverCPU is the CPU time kube-apiserver and etcd have used so far.
func (r *runner) serverCPU() (time.Duration, error) {
	a, e, err := r.env.Cluster.ServerCPU()
	return time.Duration(framework.CPUSeconds(a+e) * float64(time.Second)), err
}

// awaitReady polls the controller's /readyz, or, when it serves none, its
// log for its ReadyLog message, and returns when it was first seen, from
// start.
func (r *runner) awaitReady(ctx context.Context, logPath string, start time.Time, timeout time.Duration) (time.Duration, error) {
	var ready func(context.Context) bool
	switch {
	case r.ep.Ready != "":
		ready = func(ctx context.Context) bool { return httpOK(ctx, r.ep.Ready) }
	case r.ctrl.ReadyLog != "":
		scan := &logScan{path: logPath, want: []byte(r.ctrl.ReadyLog)}
		ready = func(context.Context) bool { return scan.found() }
	default:
		return 0, errors.New("the controller tells no readiness (no /readyz, no ReadyLog)")
	}
	ticker := time.NewTicker(r.cfg.Poll)
	defer ticker.Stop()
	for {
		if ready(ctx) {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, fmt.Errorf("not ready after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("interrupted while waiting for readiness: %w", context.Cause(ctx))
		case <-ticker.C:
		}
	}
}

func httpOK(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// logScan looks for a message in a growing log, reading each byte once.
type logScan struct {
	path  string
	want  []byte
	off   int64
	carry []byte // the tail of the last read, for a message cut across reads
}

func (s *logScan) found() bool {
	f, err := os.Open(s.path)
	if err != nil {
		return false
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		n, err := f.ReadAt(buf, s.off)
		s.off += int64(n)
		data := append(s.carry, buf[:n]...)
		if bytes.Contains(data, s.want) {
			return true
		}
		s.carry = append([]byte(nil), data[max(0, len(data)-len(s.want)):]...)
		if err != nil || n < len(buf) {
			return false
		}
	}
}
