// Package hollow runs the controller against real kubelets: hollow nodes
// (hack/tools/hollow-node), the kubelet of the Kubernetes release the project
// builds against with a fake container runtime, controller attach/detach on,
// and a CSI mock driver registered with each through its plugins_registry.
// The kubelet's volume manager decides here what test/kubeletsim only
// imitates: it writes the Node and the CSINode, reports volumesInUse on its
// status cycle, waits for node.status.volumesAttached to list a volume under
// the unique name it computes before it stages and publishes it, and
// unmounts before the pod goes.
//
// Every scenario runs twice, with this controller and with
// kube-controller-manager's attachdetach controller: a scenario that fails
// for both is a defect of the harness, one that fails only for this
// controller is a defect of the controller. Each run starts its own hollow
// nodes, named after the test, and logs the time of every step.
package hollow

import (
	"context"
	"fmt"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// st is the package's stack (etcd, kube-apiserver, a csi-mock-driver and
// the real csi-attacher per driver), started by TestMain.
var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	st0, stop, err := stack.StartBuilt(context.Background(), klog.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st = st0
	defer func() {
		if err := stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}()
	return m.Run()
}
