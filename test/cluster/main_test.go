// Package cluster runs the controller in a cluster as users run it
// (test/e2e/stack StartCluster): kube-scheduler, kube-controller-manager
// with every controller but its attachdetach (--controllers=*,-attachdetach),
// the CSI external-provisioner and external-attacher of a zonal CSI driver,
// a WaitForFirstConsumer StorageClass, and hollow nodes (real kubelets) in
// zones. A test drives workloads as a user does, through the API, and no
// component's part is played by the test: the StatefulSet controller creates
// pods and claims, the scheduler places them, the provisioner creates each
// volume in its pod's zone, this controller attaches it, the kubelet mounts
// it.
//
// A workload scenario runs twice (forEachController), with this controller
// and with kube-controller-manager's own attachdetach controller
// (--controllers=*): the control; the cut-over and the guard's tests run the
// two by design. Each step's time is logged ("timing" lines), an
// AttachmentWatch fails a run in which a single-node volume was attached to
// two nodes at any moment, and every run of this controller ends with its
// guard quiet: no other attach/detach controller reported beside a
// kube-controller-manager running --controllers=*,-attachdetach.
package cluster

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// binaries are this controller and kubeletsim, built once by TestMain
// (or named by $ADC_CONTROLLER_BINARY, $ADC_KUBELETSIM_BINARY).
var binaries stack.Options

// skipReason, when set, skips every test: binaries are missing.
var skipReason string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	missing, err := stack.MissingClusterBinaries(stack.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if len(missing) > 0 {
		skipReason = "missing " + strings.Join(missing, ", ") + ": run make test-cluster, or hack/build-tools.sh " + strings.Join(stack.ClusterBinaries, " ")
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "adc-cluster-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }() // binaries only
	binaries, err = stack.Build(context.Background(), dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	binaries.Logger = klog.Background()
	return m.Run()
}
