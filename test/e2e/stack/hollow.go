package stack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HollowNodeBinary is the real kubelet with a fake container runtime
// (hack/tools/hollow-node), in BinDir.
const HollowNodeBinary = "hollow-node"

// HollowNodeOptions configure one hollow node.
type HollowNodeOptions struct {
	// Name is the node's name.
	Name string
	// Labels are the node's labels (e.g. its zone). On a stack with
	// Options.Topology, the node's drivers report its
	// topology.kubernetes.io/zone label as their topology.
	Labels map[string]string
	// Drivers are the CSI drivers registered with its kubelet, each served
	// by a csi-mock-driver of the node's own. Default: the stack's.
	Drivers []string
	// NoAttachDrivers are drivers among Drivers whose volumes need no
	// attach (CSIDriver attachRequired false): their node service stages
	// without the device the attach would publish.
	NoAttachDrivers []string
	// KubeletArgs are appended to the hollow node's flags.
	KubeletArgs []string
}

// HollowNode is a real kubelet (hack/tools/hollow-node) with a CSI mock
// driver per driver registered with it through its plugins_registry, as
// node-driver-registrar does. Its Node, CSINode and node status are the
// kubelet's own. The driver reports node ID NodeID(driver) = "<driver>.<node>":
// not the node's name, as real drivers do.
type HollowNode struct {
	Name string
	// Zone is its topology.kubernetes.io/zone label, "" without one.
	Zone    string
	RootDir string
	Drivers []string

	stack *Stack
	args  []string

	mu      sync.Mutex
	kubelet *Process
	// kubelets are every kubelet process of the node, restarts included.
	kubelets   []*Process
	driverProc []*Process
}

// NodeID is the node ID the node's driver reports.
func (n *HollowNode) NodeID(driver string) string { return driver + "." + n.Name }

// StartHollowNode starts a node's CSI drivers, then its kubelet, and returns
// once the node is Ready and its CSINode lists every driver.
func (s *Stack) StartHollowNode(ctx context.Context, o HollowNodeOptions) (*HollowNode, error) {
	bin := filepath.Join(s.binDir, HollowNodeBinary)
	mockBin := filepath.Join(s.binDir, MockDriverBinary)
	if err := checkBinary(bin, "hack/build-tools.sh hollow-node"); err != nil {
		return nil, err
	}
	drivers := o.Drivers
	if len(drivers) == 0 {
		drivers = s.Drivers
	}
	// Unix socket paths are short (108 bytes): the root is short too.
	root, err := os.MkdirTemp(s.Cluster.Dir, "hn")
	if err != nil {
		return nil, err
	}
	n := &HollowNode{Name: o.Name, Zone: o.Labels[v1.LabelTopologyZone], RootDir: root, Drivers: drivers, stack: s}
	registry := filepath.Join(root, "plugins_registry")
	for _, d := range drivers {
		socket := filepath.Join(root, "plugins", d, "csi.sock")
		if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
			return nil, err
		}
		args := []string{
			"--endpoint=" + socket, "--driver-name=" + d, "--node-id=" + n.NodeID(d),
			"--kubelet-registration-dir=" + registry, "--any-handle",
			fmt.Sprintf("--attach-required=%t", !slices.Contains(o.NoAttachDrivers, d)),
			"-v=2",
		}
		if zone := o.Labels[v1.LabelTopologyZone]; s.topology && zone != "" {
			args = append(args, "--zone="+zone)
		}
		p, err := s.start("csi-mock-driver-"+o.Name+"-"+d, mockBin, args...)
		if err != nil {
			return nil, err
		}
		n.driverProc = append(n.driverProc, p)
		reg := filepath.Join(registry, d+"-reg.sock")
		if err := p.WaitFor(ctx, startTimeout, "registration socket of "+p.Name, func(context.Context) (bool, error) {
			info, err := os.Stat(reg)
			return err == nil && info.Mode()&os.ModeSocket != 0, nil
		}); err != nil {
			return nil, err
		}
	}
	var labels []string
	for k, v := range o.Labels {
		labels = append(labels, k+"="+v)
	}
	slices.Sort(labels)
	n.args = append([]string{
		"--kubeconfig=" + s.Cluster.Kubeconfig,
		"--name=" + o.Name,
		"--root-dir=" + root,
		"--node-labels=" + strings.Join(labels, ","),
		"-v=2",
	}, o.KubeletArgs...)
	if err := n.StartKubelet(ctx); err != nil {
		return n, err
	}
	return n, nil
}

// StartKubelet starts the node's kubelet (again, after StopKubelet) and
// waits until the node is Ready and its CSINode lists every driver.
func (n *HollowNode) StartKubelet(ctx context.Context) error {
	p, err := n.stack.start("hollow-node-"+n.Name, filepath.Join(n.stack.binDir, HollowNodeBinary), n.args...)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.kubelet = p
	n.kubelets = append(n.kubelets, p)
	n.mu.Unlock()
	started := time.Now()
	err = p.WaitFor(ctx, startTimeout, "node "+n.Name+" Ready with its CSINode", func(ctx context.Context) (bool, error) {
		return n.registered(ctx)
	})
	if err != nil {
		return err
	}
	n.stack.logger.V(1).Info("Hollow node ready", "node", n.Name, "duration", time.Since(started).Round(time.Millisecond), "log", p.LogPath)
	return nil
}

// StopKubelet stops the kubelet (SIGTERM); its drivers stay, as they do on
// a node whose kubelet restarts.
func (n *HollowNode) StopKubelet() error {
	n.mu.Lock()
	p := n.kubelet
	n.mu.Unlock()
	return p.Stop(StopGrace)
}

// Kubelet is the node's current kubelet process.
func (n *HollowNode) Kubelet() *Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.kubelet
}

// Processes are every process of the node: its kubelets, restarts included,
// and its drivers.
func (n *HollowNode) Processes() []*Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append(slices.Clone(n.kubelets), n.driverProc...)
}

// KubeletLog is what every kubelet of the node logged, restarts included.
func (n *HollowNode) KubeletLog() (string, error) {
	n.mu.Lock()
	kubelets := slices.Clone(n.kubelets)
	n.mu.Unlock()
	var b strings.Builder
	for _, p := range kubelets {
		data, err := os.ReadFile(p.LogPath)
		if err != nil {
			return "", fmt.Errorf("read log of %s: %w", p.Name, err)
		}
		b.Write(data)
	}
	return b.String(), nil
}

// Stop stops the kubelet, then the drivers.
func (n *HollowNode) Stop() error {
	var errs []error
	for _, p := range n.Processes() {
		errs = append(errs, p.Stop(StopGrace))
	}
	return errors.Join(errs...)
}

// registered says whether the node is Ready and its CSINode lists each of
// its drivers with the node ID the driver reports.
func (n *HollowNode) registered(ctx context.Context) (bool, error) {
	ok, err := n.stack.nodeReady(ctx, n.Name)
	if !ok || err != nil {
		return false, err
	}
	csiNode, err := n.stack.Cluster.Client.StorageV1().CSINodes().Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get CSINode %s: %w", n.Name, err)
	}
	for _, d := range n.Drivers {
		if !slices.ContainsFunc(csiNode.Spec.Drivers, func(cd storagev1.CSINodeDriver) bool {
			return cd.Name == d && cd.NodeID == n.NodeID(d)
		}) {
			return false, nil
		}
	}
	return true, nil
}
