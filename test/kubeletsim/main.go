// Command kubeletsim simulates the kubelets of N nodes for attach/detach
// tests and benchmarks: it registers managed, Ready nodes and their
// CSINodes, and reports node.status.volumesInUse from the pods on them and
// the volumes attached to them. See package sim.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/kubeletsim/sim"
)

func main() {
	fs := flag.NewFlagSet("kubeletsim", flag.ExitOnError)
	opts := sim.NewOptions()
	opts.AddFlags(fs)
	klog.InitFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	err := run(ctx, opts)
	if err != nil {
		logger.Error(err, "kubeletsim failed")
	}
	klog.Flush()
	if err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context, opts *sim.Options) error {
	config, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %q: %w", opts.Kubeconfig, err)
	}
	config.QPS = float32(opts.KubeAPIQPS)
	config.Burst = opts.KubeAPIBurst
	config.UserAgent = "kubeletsim"
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	s, err := sim.New(client, *opts)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}
