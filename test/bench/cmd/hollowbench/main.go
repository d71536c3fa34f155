// Command hollowbench measures pod startup with attachable volumes on hollow
// nodes (the real kubelet of Kubernetes v1.37.2 with a fake container
// runtime, hack/tools/hollow-node), for this repository's controller and
// for kube-controller-manager's attachdetach controller, one after the
// other on the same nodes of one run; and what each hollow node costs.
//
// ClusterLoader2's storage pod-startup measurement is the anchor: each
// pod's time from its creation to Running as a watch sees it, p50/p90/p99.
// The kubelet's part (a status cycle of 10 s before it reports the volume in
// use, then its mount) dominates that time; the controller's part is also
// reported: from the pod's creation to the volume listed in its node's
// volumesAttached.
//
//	go run ./test/bench/cmd/hollowbench -nodes 50 -pods-per-node 10
//
// The report goes to <results>/<date>-hollow.md (-2, -3... when that exists).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

type options struct {
	nodes, podsPerNode int
	controllers        string
	qps                float64
	burst              int
	createQPS          float64
	idle               time.Duration
	timeout            time.Duration
	results            string
}

func main() {
	var o options
	flag.IntVar(&o.nodes, "nodes", 50, "hollow nodes")
	flag.IntVar(&o.podsPerNode, "pods-per-node", 10, "pods per node, each with its own ReadWriteOnce CSI volume")
	flag.StringVar(&o.controllers, "controllers", "adc,kcm", "controllers to measure, in this order: adc (this repository's), kcm (kube-controller-manager's attachdetach)")
	flag.Float64Var(&o.qps, "qps", 20, "API QPS of each controller (kube-controller-manager's default)")
	flag.IntVar(&o.burst, "burst", 30, "API burst of each controller (kube-controller-manager's default)")
	flag.Float64Var(&o.createQPS, "create-qps", 20, "pods the bench creates per second (ClusterLoader2's storage tests create at a steady rate)")
	flag.DurationVar(&o.idle, "idle", 30*time.Second, "how long the idle cost of the nodes is measured")
	flag.DurationVar(&o.timeout, "timeout", 15*time.Minute, "bound on each phase")
	flag.StringVar(&o.results, "results", "bench/results", "directory of the report")
	flag.Parse()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "hollowbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	logger := klog.Background()
	st, stop, err := stack.StartBuilt(ctx, logger)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stop()) }()

	// The bench's own client: its creates must not be what limits the run.
	config := rest.CopyConfig(st.Cluster.Config)
	config.QPS, config.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}

	r := &report{opts: o, started: time.Now()}
	nodes, took, err := startNodes(ctx, st, o.nodes)
	r.nodesStart = took
	if err != nil {
		return err
	}
	fmt.Printf("%d hollow nodes Ready in %s\n", len(nodes), took.Round(time.Second))
	if r.idle, err = measure(ctx, nodeProcesses(nodes), o.idle); err != nil {
		return err
	}
	for _, kind := range strings.Split(o.controllers, ",") {
		res, err := runController(ctx, st, client, nodes, kind, o)
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		r.runs = append(r.runs, res)
	}
	path, err := r.write(o.results)
	if err != nil {
		return err
	}
	fmt.Println("report:", path)
	return nil
}

// startNodes starts n hollow nodes, a few at a time: a kubelet's start is
// CPU-bound and the machine is small.
func startNodes(ctx context.Context, st *stack.Stack, n int) ([]*stack.HollowNode, time.Duration, error) {
	started := time.Now()
	nodes := make([]*stack.HollowNode, n)
	errs := make([]error, n)
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			nodes[i], errs[i] = st.StartHollowNode(ctx, stack.HollowNodeOptions{
				Name:    fmt.Sprintf("hollow-%03d", i),
				Labels:  map[string]string{v1.LabelTopologyZone: fmt.Sprintf("zone-%c", 'a'+i%3)},
				Drivers: []string{stack.MockDriver},
			})
		})
	}
	wg.Wait()
	return nodes, time.Since(started), errors.Join(errs...)
}

func nodeProcesses(nodes []*stack.HollowNode) []*stack.Process {
	var procs []*stack.Process
	for _, n := range nodes {
		procs = append(procs, n.Processes()...)
	}
	return procs
}

// result is one controller's run.
type result struct {
	kind        string
	pods        []podTimes
	allRunning  time.Duration // from the first create to the last pod Running
	allDetached time.Duration // from the first delete to the last VolumeAttachment gone
	controller  cost
	nodes       cost
}

func runController(ctx context.Context, st *stack.Stack, client kubernetes.Interface, nodes []*stack.HollowNode, kind string, o options) (*result, error) {
	ns := "bench-" + kind
	if _, err := framework.CreateNamespace(ctx, client, ns); err != nil {
		return nil, err
	}
	type pod struct{ name, claim, node string }
	var pods []pod
	for i := range len(nodes) * o.podsPerNode {
		pods = append(pods, pod{fmt.Sprintf("pod-%04d", i), fmt.Sprintf("claim-%04d", i), nodes[i%len(nodes)].Name})
	}
	fmt.Printf("%s: creating %d bound claims\n", kind, len(pods))
	if err := parallel(ctx, 20, len(pods), func(i int) error {
		_, _, err := framework.CreateBoundPVC(ctx, client, ns, pods[i].claim, framework.CSISource(stack.MockDriver, ns+"-"+pods[i].claim))
		return err
	}); err != nil {
		return nil, err
	}

	proc, err := startController(ctx, st, kind, o)
	if err != nil {
		return nil, err
	}
	defer func() { _ = proc.Stop(stack.StopGrace) }() // stopped below; this is for the error paths

	obs := newObserver()
	for _, p := range pods {
		handle := ns + "-" + p.claim
		obs.expect(p.name, &podTimes{
			node:   p.node,
			volume: v1.UniqueVolumeName(framework.CSIVolumeName(stack.MockDriver, handle)),
			va:     framework.VolumeAttachmentName(handle, stack.MockDriver, p.node),
		})
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if err := obs.watch(watchCtx, client, ns); err != nil {
		return nil, err
	}

	res := &result{kind: kind}
	procs := append(nodeProcesses(nodes), proc)
	before, err := sample(procs)
	if err != nil {
		return nil, err
	}
	fmt.Printf("%s: creating %d pods at %g/s\n", kind, len(pods), o.createQPS)
	start := time.Now()
	tick := time.NewTicker(time.Duration(float64(time.Second) / o.createQPS))
	defer tick.Stop()
	var createErr error
	var wg sync.WaitGroup
	var errMu sync.Mutex
	for _, p := range pods {
		obs.mu.Lock()
		obs.pods[p.name].created = time.Now()
		obs.mu.Unlock()
		wg.Go(func() {
			if _, err := framework.CreatePod(ctx, client, ns, p.name, p.node, p.claim); err != nil {
				errMu.Lock()
				createErr = errors.Join(createErr, err)
				errMu.Unlock()
			}
		})
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	wg.Wait()
	if createErr != nil {
		return nil, createErr
	}
	if err := waitAll(ctx, o.timeout, kind+": pods Running", len(pods), obs, func(t *podTimes) bool { return !t.running.IsZero() }); err != nil {
		return nil, err
	}
	res.allRunning = time.Since(start)
	after, err := sample(procs)
	if err != nil {
		return nil, err
	}
	res.nodes = costOf(before[:len(before)-1], after[:len(after)-1], len(nodes))
	res.controller = costOf(before[len(before)-1:], after[len(after)-1:], 1)

	fmt.Printf("%s: deleting %d pods\n", kind, len(pods))
	start = time.Now()
	if err := parallel(ctx, 20, len(pods), func(i int) error {
		obs.mu.Lock()
		obs.pods[pods[i].name].deleted = time.Now()
		obs.mu.Unlock()
		return client.CoreV1().Pods(ns).Delete(ctx, pods[i].name, metav1.DeleteOptions{})
	}); err != nil {
		return nil, err
	}
	if err := waitAll(ctx, o.timeout, kind+": volumes detached", len(pods), obs, func(t *podTimes) bool { return !t.vaGone.IsZero() }); err != nil {
		return nil, err
	}
	res.allDetached = time.Since(start)
	res.pods = obs.snapshot()
	if err := proc.Stop(stack.StopGrace); err != nil {
		return nil, fmt.Errorf("stop %s: %w", kind, err)
	}
	return res, nil
}

func startController(ctx context.Context, st *stack.Stack, kind string, o options) (*stack.Process, error) {
	// Both controllers take kube-controller-manager's flags for it.
	budget := []string{fmt.Sprintf("--kube-api-qps=%g", o.qps), fmt.Sprintf("--kube-api-burst=%d", o.burst)}
	switch kind {
	case "adc":
		c, err := st.StartController(ctx, budget...)
		if err != nil {
			return nil, err
		}
		return c.Process, nil
	case "kcm":
		return st.StartKubeControllerManager(ctx, budget...)
	}
	return nil, fmt.Errorf("unknown controller %q (adc or kcm)", kind)
}

// waitAll polls until every one of n pods satisfies done, printing progress.
func waitAll(ctx context.Context, timeout time.Duration, what string, n int, obs *observer, done func(*podTimes) bool) error {
	deadline := time.Now().Add(timeout)
	last := time.Now()
	for {
		got := obs.count(done)
		if got == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d after %s", what, got, n, timeout)
		}
		if time.Since(last) > 10*time.Second {
			fmt.Printf("%s: %d of %d\n", what, got, n)
			last = time.Now()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// parallel runs f(0..n-1) on workers goroutines and joins the errors.
func parallel(ctx context.Context, workers, n int, f func(i int) error) error {
	errs := make([]error, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				errs[i] = f(i)
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(append(errs, ctx.Err())...)
}

// uniqueReport returns dir/base.md, or base-2.md, base-3.md... when taken.
func uniqueReport(dir, base string) (string, error) {
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		path := filepath.Join(dir, name+".md")
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return path, nil
		} else if err != nil {
			return "", err
		}
	}
}
