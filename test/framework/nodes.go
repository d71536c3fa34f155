package framework

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// ControllerManagedAnnotation marks a node whose volumes the attach/detach
// controller attaches, rather than its kubelet.
const ControllerManagedAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

// Node returns a node managed by the attach/detach controller, with a Ready
// condition that is True.
func Node(name string) *v1.Node {
	now := metav1.Now()
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{ControllerManagedAnnotation: "true"},
		},
		Status: v1.NodeStatus{
			Conditions: []v1.NodeCondition{{
				Type:               v1.NodeReady,
				Status:             v1.ConditionTrue,
				Reason:             "KubeletReady",
				LastHeartbeatTime:  now,
				LastTransitionTime: now,
			}},
		},
	}
}

// CreateNode creates node and then writes its status, which a create may
// drop; no kubelet is there to write it.
func CreateNode(ctx context.Context, client kubernetes.Interface, node *v1.Node) (*v1.Node, error) {
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create node %s: %w", node.Name, err)
	}
	created.Status = node.Status
	updated, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update status of node %s: %w", node.Name, err)
	}
	return updated, nil
}

// SetNodeReady sets the status of the node's Ready condition.
func SetNodeReady(ctx context.Context, client kubernetes.Interface, name string, ready bool) error {
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	return updateNodeStatus(ctx, client, name, func(node *v1.Node) {
		now := metav1.Now()
		for i := range node.Status.Conditions {
			cond := &node.Status.Conditions[i]
			if cond.Type != v1.NodeReady {
				continue
			}
			if cond.Status != status {
				cond.LastTransitionTime = now
			}
			cond.Status = status
			cond.LastHeartbeatTime = now
			return
		}
		node.Status.Conditions = append(node.Status.Conditions, v1.NodeCondition{
			Type: v1.NodeReady, Status: status, LastHeartbeatTime: now, LastTransitionTime: now,
		})
	})
}

// SetVolumesInUse replaces the node's status.volumesInUse, as a kubelet
// reports the volumes it has mounted or is about to mount.
func SetVolumesInUse(ctx context.Context, client kubernetes.Interface, name string, volumes ...string) error {
	return updateNodeStatus(ctx, client, name, func(node *v1.Node) {
		node.Status.VolumesInUse = nil
		for _, volume := range volumes {
			node.Status.VolumesInUse = append(node.Status.VolumesInUse, v1.UniqueVolumeName(volume))
		}
	})
}

// updateNodeStatus applies mutate to the current node, retrying on conflicts
// with the controller under test, which writes the same status.
func updateNodeStatus(ctx context.Context, client kubernetes.Interface, name string, mutate func(*v1.Node)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(node)
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("update status of node %s: %w", name, err)
	}
	return nil
}
