package chaos

import (
	"context"
	"fmt"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// st is the package's stack, started by TestMain: etcd, kube-apiserver, a
// CSI mock driver and the external-attacher for each driver.
var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "adc-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	opts, err := stack.Build(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	opts.Logger = klog.Background().V(1)
	// Watches served from etcd: a watcher resumes across an apiserver
	// restart from the last resourceVersion it saw.
	opts.APIServerFlags = append(opts.APIServerFlags, "--watch-cache=false")
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
	for _, d := range st.Drivers {
		if _, err := framework.CreateCSIDriver(ctx, st.Cluster.Client, d, new(true)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return m.Run()
}
