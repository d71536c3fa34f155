package stack

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// KubeControllerManagerBinary is the real kube-controller-manager, in BinDir
// (hack/build-tools.sh kube-controller-manager).
const KubeControllerManagerBinary = "kube-controller-manager"

// StartKubeControllerManager starts the real kube-controller-manager with
// only its attachdetach controller, the one this controller replaces: no
// leader election, no serving, no service account credentials (nothing
// issues them here), and a FlexVolume directory of its own. It returns once
// the controller's caches are synced (framework.KubeControllerManagerSynced).
// extra is appended to the flags.
func (s *Stack) StartKubeControllerManager(ctx context.Context, extra ...string) (*Process, error) {
	bin := filepath.Join(s.binDir, KubeControllerManagerBinary)
	if err := checkBinary(bin, "hack/build-tools.sh kube-controller-manager"); err != nil {
		return nil, err
	}
	flexDir, err := os.MkdirTemp(s.Cluster.Dir, "flexvolume-")
	if err != nil {
		return nil, err
	}
	p, err := s.start(KubeControllerManagerBinary, bin, framework.KubeControllerManagerArgs(s.Cluster.Kubeconfig, flexDir, extra...)...)
	if err != nil {
		return nil, err
	}
	err = p.WaitFor(ctx, startTimeout, "start of "+p.Name, func(context.Context) (bool, error) {
		return framework.KubeControllerManagerSynced(p.Tail(1 << 20)), nil
	})
	if err != nil {
		return p, err
	}
	s.logger.V(1).Info("kube-controller-manager started", "pid", p.Pid(), "log", p.LogPath)
	return p, nil
}

// StartKubeControllerManagerElected starts kube-controller-manager with
// only its attachdetach controller and leader election on, the Lease
// kube-system/lease (extra appended), and returns once it runs, leading or
// waiting for the Lease: a second replica waits there.
func (s *Stack) StartKubeControllerManagerElected(ctx context.Context, lease string, extra ...string) (*Process, error) {
	bin := filepath.Join(s.binDir, KubeControllerManagerBinary)
	if err := checkBinary(bin, "hack/build-tools.sh kube-controller-manager"); err != nil {
		return nil, err
	}
	flexDir, err := os.MkdirTemp(s.Cluster.Dir, "flexvolume-")
	if err != nil {
		return nil, err
	}
	args := framework.KubeControllerManagerArgs(s.Cluster.Kubeconfig, flexDir,
		append([]string{"--leader-elect=true", "--leader-elect-resource-name=" + lease}, extra...)...)
	p, err := s.start(KubeControllerManagerBinary, bin, args...)
	if err != nil {
		return nil, err
	}
	err = p.WaitFor(ctx, startTimeout, "start of "+p.Name, func(context.Context) (bool, error) {
		// "Attempting to acquire leader lease..." (client-go v0.37).
		return strings.Contains(strings.ToLower(p.Tail(1<<20)), "attempting to acquire leader lease"), nil
	})
	if err != nil {
		return p, err
	}
	s.logger.V(1).Info("kube-controller-manager started with leader election", "pid", p.Pid(), "lease", lease, "log", p.LogPath)
	return p, nil
}
