// Package e2e runs the controller's binary with the peers it works with in a
// cluster: the real CSI external-attacher (csi-attacher) acting on its
// VolumeAttachments through a CSI mock driver, and kubeletsim playing the
// kubelets, on a real etcd and kube-apiserver (package stack). It asserts
// what users see: volumes attached and reported in node status, mounted,
// detached after unmount, handed over between nodes, migrated in-tree volumes
// attached through the CSI driver, and restarts, graceful or killed, that
// detach nothing and converge.
//
// One cluster with its drivers and attachers serves the package. Each test
// runs its own kubeletsim (nodes named after the test), its own namespace and
// its own controller, stopped when the test ends; what a test leaves behind
// is consistent (pods running, their volumes attached and mounted), so the
// next test's controller has nothing to do with it.
package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// st is the package's stack, started by TestMain.
var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "adc-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }() // binaries only; the OS cleans /tmp
	opts, err := stack.Build(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts.Logger = klog.Background()
	st, err = stack.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := st.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	// Both drivers need an attach; so would a missing CSIDriver, but the
	// objects say it for the reader.
	for _, d := range st.Drivers {
		if _, err := framework.CreateCSIDriver(ctx, st.Cluster.Client, d, new(true)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}
