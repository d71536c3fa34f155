package chaos

import (
	"context"
	"fmt"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// st is the package's stack, started by TestMain: etcd, kube-apiserver, a
// CSI mock driver and the external-attacher for each driver.
var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Watches served from etcd: a watcher resumes across an apiserver
	// restart from the last resourceVersion it saw, unless etcd was
	// compacted past it (framework.Cluster.CompactEtcd).
	var stop func() error
	var err error
	st, stop, err = stack.StartBuilt(context.Background(), klog.Background().V(1), "--watch-cache=false")
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
