// Command demo shows the attach/detach controller doing its job in a local,
// throw-away cluster run as users run one: `make demo` builds what it needs
// and runs it.
//
// It starts, all on loopback (package test/e2e/stack, StartCluster): etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager with every
// controller but its attachdetach (--controllers=*,-attachdetach), this
// controller, for two CSI drivers a zonal mock driver with the real CSI
// external-attacher and external-provisioner, a WaitForFirstConsumer
// StorageClass, and four hollow nodes in two zones: the real kubelet of
// Kubernetes v1.37.2 with a fake container runtime, each with the two CSI
// drivers registered. A pod goes Running because its kubelet mounted its
// volumes once the controller had listed them in the node's status. Then it
// plays a short story and prints what happens as it happens:
//
//  1. a StatefulSet with a volumeClaimTemplate: the scheduler picks each
//     pod's node, the provisioner creates its volume in that node's zone,
//     the controller attaches it, the kubelet mounts it;
//  2. the node of the StatefulSet's first pod is drained (kubectl drain):
//     the pod is evicted and re-created on the other node of its zone, its
//     volume detached from the old node and attached to the new one;
//  3. pods with claims bound to CSI volumes, an RWX volume on two nodes, an
//     in-tree AWS EBS volume on nodes that migrate it to CSI, and one RWO
//     volume wanted by pods on two nodes: the second pod gets a "Waiting for
//     detach" warning, and /explain says why it waits;
//  4. the first pod of the RWO volume is deleted: its kubelet unmounts it, the
//     controller detaches it and attaches it to the other node, whose
//     kubelet mounts it and runs the waiting pod.
//
// After the story it keeps watching until Ctrl-C (or --duration), which
// stops every process and removes the cluster's temp directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// durationEnv sets the default of --duration, for `DEMO_DURATION=60s make demo`.
const durationEnv = "DEMO_DURATION"

type options struct {
	binDir   string
	duration time.Duration
	nodes    int
	zones    int
	pause    time.Duration
}

func main() {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	opts := options{nodes: 4, zones: 2, pause: 5 * time.Second}
	if v := os.Getenv(durationEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s=%q: %s\n", durationEnv, v, err)
			os.Exit(2)
		}
		opts.duration = d
	}
	fs.StringVar(&opts.binDir, "bin-dir", "", "Directory of etcd, kube-apiserver, kube-scheduler, kube-controller-manager, csi-attacher, csi-provisioner, csi-mock-driver, hollow-node, attach-detach-controller and kubeletsim. Default: _output/bin of the module.")
	fs.IntVar(&opts.nodes, "nodes", opts.nodes, "Hollow nodes, spread over --zones zones (at least 4: the story drains a node and needs another one in its zone).")
	fs.IntVar(&opts.zones, "zones", opts.zones, "Zones (zone-a, zone-b, ...): node i is in zone i mod zones.")
	fs.DurationVar(&opts.duration, "duration", opts.duration, "Stop by itself this long after the start, once the story is told (default $"+durationEnv+"); 0 runs until Ctrl-C. The story fails the run (exit code 1) if it does not complete.")
	fs.DurationVar(&opts.pause, "pause", opts.pause, "Pause between the story's steps, to read the output; none with --duration.")
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if opts.zones < 1 || opts.nodes < 2*opts.zones || opts.nodes < 4 {
		fmt.Fprintf(os.Stderr, "--nodes (%d) must be at least 4 and twice --zones (%d): a drained node needs another in its zone\n", opts.nodes, opts.zones)
		os.Exit(2)
	}
	if opts.duration < 0 {
		fmt.Fprintf(os.Stderr, "--duration must not be negative, got %s\n", opts.duration)
		os.Exit(2)
	}
	if opts.duration > 0 {
		opts.pause = 0
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, opts, newPrinter(os.Stdout))
	klog.Flush()
	switch {
	case errors.Is(err, context.Canceled):
		// Ctrl-C: the way to stop the demo.
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}
