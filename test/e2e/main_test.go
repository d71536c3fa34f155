// Package e2e runs the controller's binary with the peers it works with in a
// cluster: the real CSI external-attacher (csi-attacher) acting on its
// VolumeAttachments through a CSI mock driver, and kubeletsim playing the
// kubelets, on a real etcd and kube-apiserver (package stack). It asserts
// what users see: volumes attached and reported in node status, mounted,
// detached after unmount, handed over between nodes, migrated in-tree volumes
// attached through the CSI driver, and restarts, graceful or killed, that
// detach nothing and converge. In shadow mode beside the real
// kube-controller-manager (its kube-controller-manager binary too), the
// controller finds no disagreement on the demo's workload.
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
)

// st is the package's stack, started by TestMain.
var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var stop func() error
	var err error
	st, stop, err = stack.StartBuilt(context.Background(), klog.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	return m.Run()
}
