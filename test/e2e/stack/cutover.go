package stack

// The cut-over of docs/operations.md on a whole cluster
//
// "Switching from kube-controller-manager's controller" has an operator
// change kube-controller-manager's --controllers and start or stop this
// controller's Deployment, while pods keep running. On a Cluster:
//
//	SwitchControllerManager(ctx, false)   kube-controller-manager restarted with
//	                                      --controllers=*,-attachdetach (its
//	                                      static pod's flags changed), true: *
//	StartControllerReplicas(ctx, 2, args) the Deployment scaled to 2 replicas,
//	                                      leader election on, args the
//	                                      manifest's (ManifestControllerArgs)
//	StopControllerReplicas(replicas)      scaled to 0: SIGTERM to every replica
//
// and a DetachWatch says whether any of it disturbed the volume of a pod
// that kept running. EphemeralDeployment and its helpers are the workload
// with generic ephemeral volumes beside StatefulSet's.

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

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// EphemeralVolume is the generic ephemeral volume of EphemeralDeployment's
// pods: the ephemeral volume controller names pod P's claim P-scratch.
const EphemeralVolume = "scratch"

// ManifestControllerArgs are the arguments of the attach-detach-controller
// container in manifests/base/deployment.yaml, as operators deploy it
// (leader election on the Lease kube-system/attach-detach-controller with
// the default timings, the API budget, the workers), without --secure-port:
// replicas on one host each get a free port.
func ManifestControllerArgs() ([]string, error) {
	root, err := framework.ModuleRoot()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "manifests", "base", "deployment.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the manifest's Deployment: %w", err)
	}
	var d appsv1.Deployment
	if err := yaml.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == ControllerBinary {
			return slices.DeleteFunc(slices.Clone(c.Args), func(a string) bool {
				return strings.HasPrefix(a, "--secure-port")
			}), nil
		}
	}
	return nil, fmt.Errorf("%s: no container %s", path, ControllerBinary)
}

// SwitchControllerManager restarts kube-controller-manager with its
// attachdetach controller on (--controllers=*) or off
// (--controllers=*,-attachdetach), its other flags unchanged, as the kubelet
// does when an operator changes the flags of its static pod: SIGTERM to the
// old process, then the new one. It returns once the new process runs its
// controllers: with leader election, once it acquired the Lease, which the
// old one did not release (kube-controller-manager v1.37 keeps it on exit
// unless the alpha gate ControllerManagerReleaseLeaderElectionLockOnExit
// is on), so up to a lease duration after the restart; with attachdetach
// on, once that controller's caches are synced; with it off, once its log
// says the controller is disabled (the check of the runbook's step 3).
func (c *Cluster) SwitchControllerManager(ctx context.Context, attachDetach bool) (*Process, error) {
	if c.ControllerManager != nil {
		if err := c.ControllerManager.Stop(StopGrace); err != nil {
			return nil, fmt.Errorf("stop kube-controller-manager: %w", err)
		}
	}
	p, err := c.StartControllerManager(ctx, ControllerManagerOptions{
		AttachDetach:   attachDetach,
		LeaderElection: c.opts.LeaderElection,
		NodeLifecycle:  c.opts.NodeLifecycle,
		Args:           c.opts.ControllerManagerArgs,
	})
	if err != nil {
		return p, err
	}
	c.ControllerManager = p
	err = p.WaitFor(ctx, startTimeout+2*time.Minute, "controllers of "+p.Name, func(context.Context) (bool, error) {
		log := p.Tail(1 << 22)
		// "Successfully acquired lease" (client-go v0.37; lower case before).
		if c.opts.LeaderElection && !strings.Contains(strings.ToLower(log), "successfully acquired lease") {
			return false, nil
		}
		if attachDetach {
			return framework.KubeControllerManagerSynced(log), nil
		}
		return attachDetachDisabled(log), nil
	})
	if err != nil {
		return p, err
	}
	if attachDetach {
		c.AttachDetach = KubeControllerManager
	}
	return p, nil
}

// attachDetachDisabled says whether kube-controller-manager's log says its
// attachdetach controller is disabled, as the runbook's step 3 greps it.
func attachDetachDisabled(log string) bool {
	for line := range strings.Lines(log) {
		if strings.Contains(line, "controller is disabled") && strings.Contains(line, "attach-detach") {
			return true
		}
	}
	return false
}

// StartControllerReplicas starts n replicas of this controller with args
// (ManifestControllerArgs: leader election among them, as the Deployment
// runs them) and returns them and the leader once one leads: its log says
// "Started" (state recovered, every pod read). Cluster.Controller is the
// leader from then on.
func (c *Cluster) StartControllerReplicas(ctx context.Context, n int, args ...string) (replicas []*Controller, leader *Controller, err error) {
	errs := make([]error, n)
	replicas = make([]*Controller, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { replicas[i], errs[i] = c.StartController(ctx, args...) })
	}
	wg.Wait()
	replicas = slices.DeleteFunc(replicas, func(r *Controller) bool { return r == nil })
	if err := errors.Join(errs...); err != nil {
		return replicas, nil, err
	}
	err = poll(ctx, startTimeout+time.Minute, func(context.Context) (bool, error) {
		for _, r := range replicas {
			if strings.Contains(r.Process.Tail(1<<22), `"Started" workers=`) {
				leader = r
				return true, nil
			}
			if err := r.Process.ExitError(); err != nil {
				return false, err
			}
		}
		return false, nil
	})
	if err != nil {
		return replicas, nil, fmt.Errorf("no replica of %d started leading: %w", n, err)
	}
	c.Controller = leader
	c.AttachDetach = Ours
	return replicas, leader, nil
}

// StopControllerReplicas stops every replica at once, as scaling the
// Deployment to 0 does (SIGTERM to each), and waits until each has exited,
// the leader after its handoff (--handoff-timeout, 15 s at most). grace
// bounds each; an exit other than a clean one is an error.
// Cluster.Controller is nil then.
func (c *Cluster) StopControllerReplicas(replicas []*Controller, grace time.Duration) error {
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	for i, r := range replicas {
		wg.Go(func() { errs[i] = r.Stop(grace) })
	}
	wg.Wait()
	c.Controller = nil
	return errors.Join(errs...)
}

// EphemeralDeployment returns a Deployment of replicas pods, each with a
// generic ephemeral volume EphemeralVolume (volumeClaimTemplate: 1Gi,
// ReadWriteOnce, storageClass) mounted at /scratch: the ephemeral volume
// controller creates claim POD-scratch owned by the pod, the garbage
// collector deletes it with the pod.
func EphemeralDeployment(ns, name string, replicas int32, storageClass string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	grace := int64(1)
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Containers: []v1.Container{{
						Name:         "app",
						Image:        "registry.k8s.io/pause:3.10",
						VolumeMounts: []v1.VolumeMount{{Name: EphemeralVolume, MountPath: "/scratch"}},
					}},
					Volumes: []v1.Volume{{
						Name: EphemeralVolume,
						VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{
							VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{
								Spec: v1.PersistentVolumeClaimSpec{
									AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
									StorageClassName: &storageClass,
									Resources: v1.VolumeResourceRequirements{
										Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
									},
								},
							},
						}},
					}},
				},
			},
		},
	}
}

// ScaleDeployment sets the Deployment's replicas (the scale subresource,
// as kubectl scale does).
func ScaleDeployment(ctx context.Context, client kubernetes.Interface, ns, name string, replicas int32) error {
	patch := fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas)
	if _, err := client.AppsV1().Deployments(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "scale"); err != nil {
		return fmt.Errorf("scale Deployment %s/%s to %d: %w", ns, name, replicas, err)
	}
	return nil
}

// WaitDeploymentRunning waits until the Deployment has rolled out: its
// controller has seen its latest spec, exactly its replicas pods exist (a
// pod scaled away or evicted is gone), each Running and Ready and not being
// deleted. It returns the pods, sorted by name.
func WaitDeploymentRunning(ctx context.Context, client kubernetes.Interface, ns, name string, timeout time.Duration) ([]v1.Pod, error) {
	var pods []v1.Pod
	var why string
	err := poll(ctx, timeout, func(ctx context.Context) (bool, error) {
		var err error
		pods, why, err = deploymentRolledOut(ctx, client, ns, name)
		return why == "", err
	})
	if err != nil {
		return nil, fmt.Errorf("deployment %s/%s not rolled out: %s: %w", ns, name, why, err)
	}
	return pods, nil
}

func deploymentRolledOut(ctx context.Context, client kubernetes.Interface, ns, name string) ([]v1.Pod, string, error) {
	d, err := client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("get Deployment %s/%s: %w", ns, name, err)
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	if d.Status.ObservedGeneration < d.Generation {
		return nil, fmt.Sprintf("its controller has not seen generation %d", d.Generation), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil {
		return nil, "", fmt.Errorf("deployment %s/%s selector: %w", ns, name, err)
	}
	list, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, "", fmt.Errorf("list pods of Deployment %s/%s: %w", ns, name, err)
	}
	var waiting []string
	for _, p := range list.Items {
		switch {
		case p.DeletionTimestamp != nil:
			waiting = append(waiting, p.Name+" being deleted")
		case p.Status.Phase != v1.PodRunning:
			waiting = append(waiting, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
		case !podReady(&p):
			waiting = append(waiting, p.Name+" not Ready")
		}
	}
	if n := int32(len(list.Items)); n != replicas {
		waiting = append(waiting, fmt.Sprintf("%d pods, want %d", n, replicas))
	}
	if len(waiting) > 0 {
		return nil, strings.Join(waiting, ", "), nil
	}
	pods := list.Items
	slices.SortFunc(pods, func(a, b v1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return pods, "", nil
}

// PodClaims are the claims of the pod's volumes: a persistentVolumeClaim's
// claimName, and POD-VOLUME for a generic ephemeral volume.
func PodClaims(pod *v1.Pod) []string {
	var claims []string
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			claims = append(claims, v.PersistentVolumeClaim.ClaimName)
		case v.Ephemeral != nil:
			claims = append(claims, pod.Name+"-"+v.Name)
		}
	}
	return claims
}
