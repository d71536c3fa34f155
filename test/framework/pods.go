package framework

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// pauseImage is never pulled: no kubelet runs. It only makes pods valid.
const pauseImage = "registry.k8s.io/pause:3.10"

// Namespace returns a namespace object.
func Namespace(name string) *v1.Namespace {
	return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// CreateNamespace creates Namespace(name).
func CreateNamespace(ctx context.Context, client kubernetes.Interface, name string) (*v1.Namespace, error) {
	ns, err := client.CoreV1().Namespaces().Create(ctx, Namespace(name), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", name, err)
	}
	return ns, nil
}

// PVCVolumes returns one pod volume per claim, named vol-0, vol-1, ...:
// claim names need not be valid volume names.
func PVCVolumes(claims ...string) []v1.Volume {
	volumes := make([]v1.Volume, 0, len(claims))
	for i, claim := range claims {
		volumes = append(volumes, v1.Volume{
			Name: fmt.Sprintf("vol-%d", i),
			VolumeSource: v1.VolumeSource{
				PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			},
		})
	}
	return volumes
}

// Pod returns a pod already scheduled to node (spec.nodeName set), with the
// given volumes, each mounted by its container at /mnt/<volume name> (a real
// kubelet sets up only the volumes a container uses).
func Pod(ns, name, node string, volumes ...v1.Volume) *v1.Pod {
	container := v1.Container{Name: "pause", Image: pauseImage}
	for _, v := range volumes {
		container.VolumeMounts = append(container.VolumeMounts, v1.VolumeMount{Name: v.Name, MountPath: "/mnt/" + v.Name})
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PodSpec{
			NodeName:   node,
			Containers: []v1.Container{container},
			Volumes:    volumes,
		},
	}
}

// CreatePod creates a pod on node that uses the given claims.
func CreatePod(ctx context.Context, client kubernetes.Interface, ns, name, node string, claims ...string) (*v1.Pod, error) {
	return CreatePodWithVolumes(ctx, client, ns, name, node, PVCVolumes(claims...)...)
}

// CreatePodWithVolumes creates a pod on node with arbitrary volumes: inline
// in-tree or CSI volumes, ephemeral volumes.
func CreatePodWithVolumes(ctx context.Context, client kubernetes.Interface, ns, name, node string, volumes ...v1.Volume) (*v1.Pod, error) {
	pod, err := client.CoreV1().Pods(ns).Create(ctx, Pod(ns, name, node, volumes...), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", ns, name, err)
	}
	return pod, nil
}
