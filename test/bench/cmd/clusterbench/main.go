// Command clusterbench measures StatefulSets with dynamically provisioned
// volumes in a whole cluster (test/e2e/stack StartCluster: kube-scheduler,
// kube-controller-manager, the CSI external-provisioner and
// external-attacher of a zonal driver, a WaitForFirstConsumer
// StorageClass, hollow nodes in zones), with this controller and with
// kube-controller-manager's attachdetach controller: a fresh cluster for
// each, the same sizes, one after the other in one run (the order
// alternates from round to round).
//
// In each cluster, three phases:
//
//   - scale-up: a StatefulSet (Parallel pod management) scaled from 0 to
//     -replicas. Until every pod is Running; per pod, from the watches:
//     created, node selected (the scheduler's annotation on the claim), PV
//     created, claim bound, pod on node, VolumeAttachment created and
//     attached, volume in node.status.volumesAttached, Running.
//     ClusterLoader2's pod startup (created to Running) p50/p90/p99, and
//     the attach's share (pod on node to volumesAttached).
//   - scale-down: the StatefulSet scaled to 0. Until every
//     VolumeAttachment is gone; per pod: deleted, gone, unmounted (out of
//     volumesInUse), detach begun, detached.
//   - drain: a second StatefulSet of -drain-pods pods, all on one node (the
//     others cordoned while they start), then that node drained
//     (stack.Drain, as kubectl drain). Until every pod runs on another node
//     of its zone; per pod: evicted, gone, unmounted, out of the old node's
//     volumesAttached, detached, new pod on its node, attached there,
//     listed, Running.
//
// The report, bench/results/<date>-cluster.md (-2, -3... when taken), puts
// the two controllers side by side with their ratio and the machine's load
// average; a plot of the scale-up is written beside it. Each cluster's
// logs and its per-pod milestones (CSV) stay in the work directory.
//
//	go run ./test/bench/cmd/clusterbench -nodes 10 -zones 2 -replicas 40 -drain-pods 6
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// options are the command's flags.
type options struct {
	nodes, zones  int
	replicas      int
	drainPods     int
	controllers   string
	rounds        int
	qps           float64
	burst         int
	timeout       time.Duration
	results       string
	workDir       string
	binDir        string
	controllerBin string
	kubeletsimBin string
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.nodes, "nodes", 10, "hollow nodes (real kubelets with a fake runtime), spread over -zones")
	fs.IntVar(&o.zones, "zones", 2, "zones (zone-a, zone-b, ...); node i is in zone i % zones")
	fs.IntVar(&o.replicas, "replicas", 40, "pods of the scale-up's StatefulSet, each with its own provisioned volume")
	fs.IntVar(&o.drainPods, "drain-pods", 6, "stateful pods on the drained node")
	fs.StringVar(&o.controllers, "controllers", "both", "attach/detach controllers to measure: ours, kcm (kube-controller-manager's) or both")
	fs.IntVar(&o.rounds, "rounds", 1, "clusters per controller; with both, the order alternates (ours first in odd rounds)")
	fs.Float64Var(&o.qps, "qps", 0, "--kube-api-qps of this controller and of kube-controller-manager (every controller of it); 0: their default, 20")
	fs.IntVar(&o.burst, "burst", 0, "--kube-api-burst, as -qps; 0: their default, 30")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on each phase")
	fs.StringVar(&o.results, "results", "bench/results", "directory of the report")
	fs.StringVar(&o.workDir, "work-dir", "_output/bench/cluster", "directory of each cluster's logs and per-pod milestones (a subdirectory per run)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory of the cluster's binaries (default: $ADC_BIN_DIR, else _output/bin)")
	fs.StringVar(&o.controllerBin, "controller-binary", os.Getenv("ADC_CONTROLLER_BINARY"), "this controller's binary (default: $ADC_CONTROLLER_BINARY, else in -bin-dir)")
	fs.StringVar(&o.kubeletsimBin, "kubeletsim-binary", os.Getenv("ADC_KUBELETSIM_BINARY"), "kubeletsim's binary, which the stack checks for (default: $ADC_KUBELETSIM_BINARY, else in -bin-dir)")
}

func (o *options) validate() error {
	var errs []error
	if o.zones < 1 || o.zones > 26 {
		errs = append(errs, fmt.Errorf("-zones %d: want 1 to 26", o.zones))
	}
	// The drained node's pods move to another node of its zone.
	if o.nodes < 2*o.zones {
		errs = append(errs, fmt.Errorf("-nodes %d: want at least two a zone (%d)", o.nodes, 2*o.zones))
	}
	if o.replicas < 1 {
		errs = append(errs, fmt.Errorf("-replicas %d: want at least 1", o.replicas))
	}
	if o.drainPods < 1 {
		errs = append(errs, fmt.Errorf("-drain-pods %d: want at least 1", o.drainPods))
	}
	if o.rounds < 1 {
		errs = append(errs, fmt.Errorf("-rounds %d: want at least 1", o.rounds))
	}
	if _, err := o.kinds(0); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// kinds are the controllers of round r (0-based), in the order they run.
func (o *options) kinds(r int) ([]stack.AttachDetach, error) {
	switch o.controllers {
	case "ours", string(stack.Ours):
		return []stack.AttachDetach{stack.Ours}, nil
	case "kcm":
		return []stack.AttachDetach{stack.KubeControllerManager}, nil
	case "both":
		if r%2 == 1 {
			return []stack.AttachDetach{stack.KubeControllerManager, stack.Ours}, nil
		}
		return []stack.AttachDetach{stack.Ours, stack.KubeControllerManager}, nil
	}
	return nil, fmt.Errorf("-controllers %q: want ours, kcm or both", o.controllers)
}

// budgetArgs are the API budget flags both controllers take, if set.
func (o *options) budgetArgs() []string {
	var args []string
	if o.qps > 0 {
		args = append(args, fmt.Sprintf("--kube-api-qps=%g", o.qps))
	}
	if o.burst > 0 {
		args = append(args, fmt.Sprintf("--kube-api-burst=%d", o.burst))
	}
	return args
}

// command is the command line that repeats the run.
func (o *options) command() string {
	args := []string{"go run ./test/bench/cmd/clusterbench",
		fmt.Sprintf("-nodes %d -zones %d -replicas %d -drain-pods %d -controllers %s", o.nodes, o.zones, o.replicas, o.drainPods, o.controllers)}
	if o.rounds != 1 {
		args = append(args, fmt.Sprintf("-rounds %d", o.rounds))
	}
	if o.qps > 0 {
		args = append(args, fmt.Sprintf("-qps %g", o.qps))
	}
	if o.burst > 0 {
		args = append(args, fmt.Sprintf("-burst %d", o.burst))
	}
	return strings.Join(args, " ")
}

func main() {
	var o options
	o.addFlags(flag.CommandLine)
	flag.Parse()
	if err := o.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "clusterbench:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "clusterbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	logger := klog.Background()
	r := &report{opts: o, started: time.Now()}
	workDir := filepath.Join(o.workDir, r.started.Format("20060102-150405"))
	for round := range o.rounds {
		kinds, err := o.kinds(round)
		if err != nil {
			return err
		}
		for _, kind := range kinds {
			dir := filepath.Join(workDir, fmt.Sprintf("%d-%s", round+1, kind))
			fmt.Printf("round %d, %s: cluster of %d nodes in %d zones (logs: %s)\n", round+1, kind, o.nodes, o.zones, dir)
			res, err := runCluster(ctx, logger, o, kind, dir)
			if err != nil {
				return fmt.Errorf("round %d, %s (logs in %s): %w", round+1, kind, dir, err)
			}
			res.round = round + 1
			r.runs = append(r.runs, res)
			fmt.Print(res.summary())
		}
	}
	path, err := r.write(o.results)
	if err != nil {
		return err
	}
	fmt.Println("report:", path)
	return nil
}
