package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Annotations the chain reads (docs/operations.md, the contract).
const (
	managedAnnotation  = "volumes.kubernetes.io/controller-managed-attach-detach"
	migratedAnnotation = "storage.alpha.kubernetes.io/migrated-plugins"
)

// world is what the client-side answer reads from the API, once per run.
type world struct {
	client kubernetes.Interface
	nodes  map[string]*nodeFacts
	// attachments are every VolumeAttachment, read at the first need.
	attachments []storagev1.VolumeAttachment
	listedVAs   bool
	vaErr       error
	drivers     map[string]*storagev1.CSIDriver
	driverErrs  map[string]error
}

// nodeFacts is a node and its CSINode.
type nodeFacts struct {
	name    string
	node    *v1.Node
	err     error
	csiNode *storagev1.CSINode
	csiErr  error
}

func newWorld(client kubernetes.Interface) *world {
	return &world{client: client, nodes: map[string]*nodeFacts{}, drivers: map[string]*storagev1.CSIDriver{}, driverErrs: map[string]error{}}
}

func (w *world) node(ctx context.Context, name string) *nodeFacts {
	if f, ok := w.nodes[name]; ok {
		return f
	}
	f := &nodeFacts{name: name}
	f.node, f.err = w.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	f.csiNode, f.csiErr = w.client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
	w.nodes[name] = f
	return f
}

func (w *world) vas(ctx context.Context) ([]storagev1.VolumeAttachment, error) {
	if !w.listedVAs {
		list, err := w.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err == nil {
			w.attachments = list.Items
		}
		w.listedVAs, w.vaErr = true, err
	}
	return w.attachments, w.vaErr
}

// driver returns the CSIDriver object, nil when there is none (attach
// required).
func (w *world) driver(ctx context.Context, name string) (*storagev1.CSIDriver, error) {
	if d, ok := w.drivers[name]; ok {
		return d, w.driverErrs[name]
	}
	d, err := w.client.StorageV1().CSIDrivers().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		d, err = nil, nil
	}
	w.drivers[name], w.driverErrs[name] = d, err
	return d, err
}

// decider says which mechanism handles an in-tree plugin on a node, as the
// controller does from the node's CSINode.
func (w *world) decider(ctx context.Context) volume.Decider {
	return func(node, plugin string) (volume.Kind, error) {
		f := w.node(ctx, node)
		if f.csiErr != nil {
			return "", fmt.Errorf("CSINode %s: %w", node, f.csiErr)
		}
		if slices.Contains(strings.Split(f.csiNode.Annotations[migratedAnnotation], ","), plugin) {
			return volume.KindCSI, nil
		}
		return volume.KindInTree, nil
	}
}

// podVolumeFacts is one volume of a pod, followed down the chain.
type podVolumeFacts struct {
	name     string
	claim    string
	pvc      *v1.PersistentVolumeClaim
	pv       *v1.PersistentVolume
	spec     *volume.Spec
	notFound string // the first link missing, said for a reader
	skip     bool   // nothing to attach (emptyDir, secret, ...)
}

// podVolumes follows every volume of pod as far as the objects go.
func (w *world) podVolumes(ctx context.Context, pod *v1.Pod) []podVolumeFacts {
	var out []podVolumeFacts
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		f := podVolumeFacts{name: vol.Name, claim: volume.ClaimName(pod, vol)}
		src := volume.Source{PodNamespace: pod.Namespace}
		if f.claim == "" {
			src.Inline = vol
		} else {
			pvc, err := w.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, f.claim, metav1.GetOptions{})
			switch {
			case err != nil:
				f.notFound = fmt.Sprintf("claim %s/%s: %v", pod.Namespace, f.claim, err)
			case vol.Ephemeral != nil && !metav1.IsControlledBy(pvc, pod):
				f.pvc = pvc
				f.notFound = fmt.Sprintf("claim %s/%s is not owned by this pod (a generic ephemeral volume's claim must be): the pod can't use it", pod.Namespace, f.claim)
			case pvc.Spec.VolumeName == "":
				f.pvc = pvc
				f.notFound = fmt.Sprintf("claim %s/%s is %s, not bound to a PersistentVolume: nothing can be attached until it is (kubectl describe pvc -n %s %s)",
					pod.Namespace, f.claim, pvcPhase(pvc), pod.Namespace, f.claim)
			default:
				f.pvc = pvc
				pv, err := w.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
				if err != nil {
					f.notFound = fmt.Sprintf("PersistentVolume %s of claim %s/%s: %v", pvc.Spec.VolumeName, pod.Namespace, f.claim, err)
				} else {
					f.pv, src.PV = pv, pv
				}
			}
			if f.notFound != "" {
				out = append(out, f)
				continue
			}
		}
		node := pod.Spec.NodeName
		spec, err := volume.Resolve(klog.Background(), src, node, w.decider(ctx))
		switch {
		case errors.Is(err, volume.ErrNotAttachable):
			if f.claim == "" {
				continue // an emptyDir, a secret...: nothing to say
			}
			f.skip = true
		case err != nil:
			f.notFound = err.Error()
		default:
			f.spec = spec
			if spec.Driver != "" && spec.Kind == volume.KindCSI {
				if d, err := w.driver(ctx, spec.Driver); err == nil && d != nil && d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired {
					f.skip = true
				}
			}
		}
		out = append(out, f)
	}
	return out
}

func pvcPhase(pvc *v1.PersistentVolumeClaim) string {
	if pvc.Status.Phase == "" {
		return "Pending"
	}
	return string(pvc.Status.Phase)
}

// podTerminated is upstream's IsPodTerminated.
func podTerminated(pod *v1.Pod) bool {
	if pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		return true
	}
	if pod.DeletionTimestamp == nil {
		return false
	}
	for _, statuses := range [][]v1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, s := range statuses {
			if s.State.Running != nil || s.State.Waiting != nil {
				return false
			}
		}
	}
	return true
}

// attachmentsOf returns the VolumeAttachments of a volume: those of its PV,
// or of its translated inline spec, on any node.
func attachmentsOf(vas []storagev1.VolumeAttachment, spec *volume.Spec) []storagev1.VolumeAttachment {
	var out []storagev1.VolumeAttachment
	for _, va := range vas {
		switch {
		case spec.PVName != "" && va.Spec.Source.PersistentVolumeName != nil && *va.Spec.Source.PersistentVolumeName == spec.PVName:
		case spec.Driver != "" && va.Spec.Attacher == spec.Driver &&
			va.Name == volume.AttachmentName(spec.VolumeHandle, spec.Driver, va.Spec.NodeName):
		default:
			continue
		}
		out = append(out, va)
	}
	return out
}

// listed says which of names a node status list holds.
func attachedListed(node *v1.Node, names []volume.Name) (volume.Name, bool) {
	for _, a := range node.Status.VolumesAttached {
		if slices.Contains(names, volume.Name(a.Name)) {
			return volume.Name(a.Name), true
		}
	}
	return "", false
}

func inUseListed(node *v1.Node, names []volume.Name) bool {
	for _, n := range node.Status.VolumesInUse {
		if slices.Contains(names, volume.Name(n)) {
			return true
		}
	}
	return false
}

func nodeReady(node *v1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
