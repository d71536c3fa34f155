package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// Annotations kubelet and the attach/detach controller agree on.
const (
	// ManagedAnnotation asks the attach/detach controller to manage the node.
	ManagedAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"
	// MigratedPluginsAnnotation lists, on a CSINode, the in-tree plugins
	// the node handles through CSI.
	MigratedPluginsAnnotation = "storage.alpha.kubernetes.io/migrated-plugins"
	// nodeIDAnnotation maps driver names to node IDs on the Node: kubelet
	// writes it next to the CSINode and csi-attacher falls back to it.
	nodeIDAnnotation = "csi.volume.kubernetes.io/nodeid"
)

// registerParallelism bounds the API calls made at once while registering.
const registerParallelism = 16

// registerNodes creates the simulated nodes (or adopts existing ones) and
// returns their UIDs, by node name.
func (s *Simulator) registerNodes(ctx context.Context) (map[string]types.UID, error) {
	uids := make([]types.UID, len(s.nodeNames))
	errs := make([]error, len(s.nodeNames))
	workqueue.ParallelizeUntil(ctx, registerParallelism, len(s.nodeNames), func(i int) {
		uids[i], errs[i] = s.ensureNode(ctx, s.nodeNames[i])
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	byName := make(map[string]types.UID, len(uids))
	for i, uid := range uids {
		byName[s.nodeNames[i]] = uid
	}
	klog.FromContext(ctx).Info("Nodes registered", "count", len(s.nodeNames), "first", s.nodeNames[0], "last", s.nodeNames[len(s.nodeNames)-1])
	return byName, nil
}

func readyCondition() v1.NodeCondition {
	now := metav1.NewTime(time.Now())
	return v1.NodeCondition{
		Type:               v1.NodeReady,
		Status:             v1.ConditionTrue,
		Reason:             "KubeletReady",
		Message:            "kubeletsim is posting ready status",
		LastHeartbeatTime:  now,
		LastTransitionTime: now,
	}
}

// ensureNode creates node name, managed, Ready and with the node labels. An
// existing node gets the managed annotation and the node labels, and a Ready
// condition only when it has none: a test may have made it NotReady on
// purpose.
func (s *Simulator) ensureNode(ctx context.Context, name string) (types.UID, error) {
	logger := klog.FromContext(ctx).WithValues("node", name)
	nodes := s.client.CoreV1().Nodes()
	labels := map[string]string{v1.LabelHostname: name, v1.LabelOSStable: "linux", "kubeletsim": "true"}
	maps.Copy(labels, s.opts.NodeLabels)
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      labels,
			Annotations: map[string]string{ManagedAnnotation: "true"},
		},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{readyCondition()}},
	}
	got, err := nodes.Create(ctx, node, metav1.CreateOptions{})
	switch {
	case err == nil:
		logger.V(2).Info("Created node")
	case apierrors.IsAlreadyExists(err):
		meta := map[string]any{"annotations": map[string]string{ManagedAnnotation: "true"}}
		if len(s.opts.NodeLabels) > 0 {
			meta["labels"] = s.opts.NodeLabels
		}
		patch, err := json.Marshal(map[string]any{"metadata": meta})
		if err != nil {
			return "", fmt.Errorf("encode node %s patch: %w", name, err)
		}
		got, err = nodes.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return "", fmt.Errorf("annotate existing node %s: %w", name, err)
		}
		logger.Info("Adopted existing node")
	default:
		return "", fmt.Errorf("create node %s: %w", name, err)
	}

	if !slices.ContainsFunc(got.Status.Conditions, func(c v1.NodeCondition) bool { return c.Type == v1.NodeReady }) {
		// conditions merge by type in a strategic merge patch.
		patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []v1.NodeCondition{readyCondition()}}})
		if err != nil {
			return "", fmt.Errorf("encode node %s status patch: %w", name, err)
		}
		if _, err := nodes.Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return "", fmt.Errorf("mark node %s Ready: %w", name, err)
		}
		logger.V(2).Info("Marked node Ready")
	}
	return got.UID, nil
}

// registerCSINodes creates (or updates) every node's CSINode as kubelet
// does at start, before any driver registers: no driver, the
// migrated-plugins annotation.
func (s *Simulator) registerCSINodes(ctx context.Context, uids map[string]types.UID) error {
	return s.eachNode(ctx, func(name string) error { return s.ensureCSINode(ctx, name, uids[name]) },
		"CSINodes created", "migratedPlugins", s.opts.MigratedPlugins)
}

// registerDrivers registers the CSI drivers on every node, as kubelet does
// when a driver's registrar connects: the driver and the node ID it gave in
// the CSINode, and in the Node's node ID annotation.
func (s *Simulator) registerDrivers(ctx context.Context) error {
	if len(s.opts.CSIDrivers) == 0 {
		return nil
	}
	return s.eachNode(ctx, func(name string) error { return s.installDrivers(ctx, name) },
		"CSI drivers registered", "drivers", (*driversFlag)(&s.opts.CSIDrivers).String())
}

// eachNode runs fn for every node, a few at a time, and logs msg once all
// succeeded.
func (s *Simulator) eachNode(ctx context.Context, fn func(name string) error, msg string, kv ...any) error {
	errs := make([]error, len(s.nodeNames))
	workqueue.ParallelizeUntil(ctx, registerParallelism, len(s.nodeNames), func(i int) {
		errs[i] = fn(s.nodeNames[i])
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	klog.FromContext(ctx).Info(msg, append([]any{"count", len(s.nodeNames)}, kv...)...)
	return nil
}

// nodeID is the ID the driver gives the node: the configured one, or one
// derived from the node's name as a cloud's instance ID is. Never the
// node's name: the CSI node ID is the driver's, and whoever reads it must
// not take it for the node's name.
func nodeID(d Driver, node string) string {
	if d.NodeID != "" {
		return d.NodeID
	}
	sum := sha256.Sum256([]byte(d.Name + "/" + node))
	return "i-" + hex.EncodeToString(sum[:])[:17]
}

// ensureCSINode creates the node's CSINode with no driver and the
// migrated-plugins annotation, or sets that annotation on the one there
// (from an earlier start: its drivers stay until they register again).
func (s *Simulator) ensureCSINode(ctx context.Context, name string, uid types.UID) error {
	logger := klog.FromContext(ctx).WithValues("node", name)
	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1",
				Kind:       "Node",
				Name:       name,
				UID:        uid,
			}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{}},
	}
	if len(s.opts.MigratedPlugins) > 0 {
		csiNode.Annotations = map[string]string{MigratedPluginsAnnotation: strings.Join(s.opts.MigratedPlugins, ",")}
	}
	csiNodes := s.client.StorageV1().CSINodes()
	_, err := csiNodes.Create(ctx, csiNode, metav1.CreateOptions{})
	switch {
	case err == nil:
		logger.V(2).Info("Created CSINode")
		return nil
	case !apierrors.IsAlreadyExists(err):
		return fmt.Errorf("create CSINode %s: %w", name, err)
	}
	err = s.updateCSINode(ctx, name, func(cn *storagev1.CSINode) {
		if cn.Annotations == nil {
			cn.Annotations = map[string]string{}
		}
		if v, ok := csiNode.Annotations[MigratedPluginsAnnotation]; ok {
			cn.Annotations[MigratedPluginsAnnotation] = v
		} else {
			delete(cn.Annotations, MigratedPluginsAnnotation)
		}
	})
	if err != nil {
		return fmt.Errorf("update existing CSINode %s: %w", name, err)
	}
	logger.Info("Updated existing CSINode")
	return nil
}

// installDrivers writes the drivers' node IDs in the Node's annotation and
// the drivers in its CSINode (replacing those of an earlier run).
func (s *Simulator) installDrivers(ctx context.Context, name string) error {
	ids := map[string]string{}
	drivers := make([]storagev1.CSINodeDriver, 0, len(s.opts.CSIDrivers))
	for _, d := range s.opts.CSIDrivers {
		ids[d.Name] = nodeID(d, name)
		drivers = append(drivers, storagev1.CSINodeDriver{Name: d.Name, NodeID: nodeID(d, name)})
	}
	value, err := json.Marshal(ids)
	if err != nil {
		return fmt.Errorf("encode node IDs of node %s: %w", name, err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{nodeIDAnnotation: string(value)}}})
	if err != nil {
		return fmt.Errorf("encode node %s patch: %w", name, err)
	}
	if _, err := s.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate node %s with CSI node IDs: %w", name, err)
	}
	if err := s.updateCSINode(ctx, name, func(cn *storagev1.CSINode) { cn.Spec.Drivers = drivers }); err != nil {
		return fmt.Errorf("register CSI drivers in CSINode %s: %w", name, err)
	}
	klog.FromContext(ctx).V(2).Info("Registered CSI drivers", "node", name)
	return nil
}

func (s *Simulator) updateCSINode(ctx context.Context, name string, change func(*storagev1.CSINode)) error {
	csiNodes := s.client.StorageV1().CSINodes()
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := csiNodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		upd := cur.DeepCopy()
		change(upd)
		_, err = csiNodes.Update(ctx, upd, metav1.UpdateOptions{})
		return err
	})
}
