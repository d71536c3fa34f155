package stack

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KubeletOptions configure one kubeletsim.
type KubeletOptions struct {
	// NodePrefix names the nodes NodePrefix0 ... NodePrefix<Nodes-1>.
	NodePrefix string
	Nodes      int
	// MigratedPlugins are the in-tree plugins the nodes handle through CSI
	// (e.g. kubernetes.io/aws-ebs), written to their CSINodes.
	MigratedPlugins []string
	// NodeLabels are set on every node as it registers (e.g. its zone).
	NodeLabels map[string]string
	// ExtraArgs are appended to the flags.
	ExtraArgs []string
}

// NodeNames returns the names of the nodes.
func (o KubeletOptions) NodeNames() []string {
	names := make([]string, o.Nodes)
	for i := range names {
		names[i] = o.NodePrefix + strconv.Itoa(i)
	}
	return names
}

// StartKubelets starts a kubeletsim for the nodes and returns once every
// node is Ready and its CSINode lists every driver of the stack.
func (s *Stack) StartKubelets(ctx context.Context, o KubeletOptions) (*Process, error) {
	drivers := make([]string, 0, len(s.Drivers))
	for _, d := range s.Drivers {
		// The mock accepts only its own name as node ID.
		drivers = append(drivers, d+"="+d)
	}
	args := []string{
		"--kubeconfig=" + s.Cluster.Kubeconfig,
		"--nodes=" + strconv.Itoa(o.Nodes),
		"--node-prefix=" + o.NodePrefix,
		"--csi-drivers=" + strings.Join(drivers, ","),
		"-v=2",
	}
	if len(o.MigratedPlugins) > 0 {
		args = append(args, "--migrated-plugins="+strings.Join(o.MigratedPlugins, ","))
	}
	if len(o.NodeLabels) > 0 {
		labels := make([]string, 0, len(o.NodeLabels))
		for k, v := range o.NodeLabels {
			labels = append(labels, k+"="+v)
		}
		slices.Sort(labels)
		args = append(args, "--node-labels="+strings.Join(labels, ","))
	}
	args = append(args, o.ExtraArgs...)
	p, err := s.start("kubeletsim-"+strings.TrimRight(o.NodePrefix, "-"), s.kubeletsimBin, args...)
	if err != nil {
		return nil, err
	}
	for _, name := range o.NodeNames() {
		err := p.WaitFor(ctx, startTimeout, "node "+name+" and its CSINode", func(ctx context.Context) (bool, error) {
			return s.nodeRegistered(ctx, name)
		})
		if err != nil {
			return p, err
		}
	}
	s.logger.V(1).Info("Kubelets ready", "nodes", o.Nodes, "prefix", o.NodePrefix, "log", p.LogPath)
	return p, nil
}

func (s *Stack) nodeRegistered(ctx context.Context, name string) (bool, error) {
	ready, err := s.nodeReady(ctx, name)
	if !ready || err != nil {
		return false, err
	}
	csiNode, err := s.Cluster.Client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get CSINode %s: %w", name, err)
	}
	for _, d := range s.Drivers {
		if !slices.ContainsFunc(csiNode.Spec.Drivers, func(cd storagev1.CSINodeDriver) bool { return cd.Name == d }) {
			return false, nil
		}
	}
	return true, nil
}

// nodeReady says whether the node exists and is Ready.
func (s *Stack) nodeReady(ctx context.Context, name string) (bool, error) {
	node, err := s.Cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	return slices.ContainsFunc(node.Status.Conditions, func(c v1.NodeCondition) bool {
		return c.Type == v1.NodeReady && c.Status == v1.ConditionTrue
	}), nil
}
