package framework

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

const (
	// MigratedPluginsAnnotation on a CSINode lists the in-tree plugins whose
	// volumes the node's kubelet handles through CSI.
	MigratedPluginsAnnotation = "storage.alpha.kubernetes.io/migrated-plugins"
	// bindCompletedAnnotation tells a PV controller, if a test runs one, that
	// the claim is bound and needs no binding.
	bindCompletedAnnotation = "pv.kubernetes.io/bind-completed"
	// volumeSize is the size of every PV and PVC; nothing reads it.
	volumeSize = "1Gi"
)

// CSIDriver returns a CSIDriver object; a nil attachRequired leaves the API
// default (true).
func CSIDriver(name string, attachRequired *bool) *storagev1.CSIDriver {
	return &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: attachRequired},
	}
}

// CreateCSIDriver creates CSIDriver(name, attachRequired).
func CreateCSIDriver(ctx context.Context, client kubernetes.Interface, name string, attachRequired *bool) (*storagev1.CSIDriver, error) {
	driver, err := client.StorageV1().CSIDrivers().Create(ctx, CSIDriver(name, attachRequired), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create CSIDriver %s: %w", name, err)
	}
	return driver, nil
}

// CSINodeDriver returns a driver entry for a CSINode.
func CSINodeDriver(name, nodeID string) storagev1.CSINodeDriver {
	return storagev1.CSINodeDriver{Name: name, NodeID: nodeID}
}

// CSINode returns the CSINode of a node, as its kubelet would register it,
// with the migrated-plugins annotation when migratedPlugins is not empty.
func CSINode(node string, drivers []storagev1.CSINodeDriver, migratedPlugins ...string) *storagev1.CSINode {
	csiNode := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec:       storagev1.CSINodeSpec{Drivers: drivers},
	}
	if csiNode.Spec.Drivers == nil {
		csiNode.Spec.Drivers = []storagev1.CSINodeDriver{}
	}
	if len(migratedPlugins) > 0 {
		csiNode.Annotations = map[string]string{MigratedPluginsAnnotation: strings.Join(migratedPlugins, ",")}
	}
	return csiNode
}

// CreateCSINode creates CSINode(node, drivers, migratedPlugins...).
func CreateCSINode(ctx context.Context, client kubernetes.Interface, node string, drivers []storagev1.CSINodeDriver, migratedPlugins ...string) (*storagev1.CSINode, error) {
	csiNode, err := client.StorageV1().CSINodes().Create(ctx, CSINode(node, drivers, migratedPlugins...), metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create CSINode %s: %w", node, err)
	}
	return csiNode, nil
}

// CSISource returns the source of a CSI persistent volume.
func CSISource(driver, handle string) v1.PersistentVolumeSource {
	return v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: handle}}
}

// VolumeAttachmentName is the name kube-controller-manager gives the
// VolumeAttachment of a CSI volume on a node; the external-attacher and
// kubelet look it up by that name. It is computed here independently of the
// controller's code.
func VolumeAttachmentName(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// CSIVolumeName is the unique name of a CSI volume in node.status
// (volumesAttached, volumesInUse).
func CSIVolumeName(driver, handle string) string {
	return "kubernetes.io/csi/" + driver + "^" + handle
}

// PVName is the name CreateBoundPVC gives the volume of claim namespace/name.
func PVName(namespace, claim string) string {
	return "pv-" + namespace + "-" + claim
}

// PVC returns a claim pre-bound to volume, without storage class.
func PVC(namespace, name, volume string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   namespace,
			Name:        name,
			Annotations: map[string]string{bindCompletedAnnotation: "yes"},
		},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: accessModes(modes),
			Resources: v1.VolumeResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse(volumeSize)},
			},
			// Empty, not nil: no default storage class is applied.
			StorageClassName: new(""),
			VolumeName:       volume,
		},
	}
}

// PV returns a volume bound to claim, with policy Retain so that nothing
// would try to delete it.
func PV(name string, src v1.PersistentVolumeSource, claim *v1.PersistentVolumeClaim, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource:        src,
			AccessModes:                   accessModes(modes),
			Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse(volumeSize)},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			ClaimRef: &v1.ObjectReference{
				Kind:       "PersistentVolumeClaim",
				APIVersion: "v1",
				Namespace:  claim.Namespace,
				Name:       claim.Name,
				UID:        claim.UID,
			},
		},
	}
}

// CreateBoundPVC creates a claim and a volume (named PVName(ns, name)) bound
// to each other, with phase Bound on both, as the PV controller would leave
// them. Without modes the access mode is ReadWriteOnce. A PV controller
// running meanwhile (kube-controller-manager with all its controllers) may
// write their status first: a conflict is read again and retried.
func CreateBoundPVC(ctx context.Context, client kubernetes.Interface, ns, name string, src v1.PersistentVolumeSource, modes ...v1.PersistentVolumeAccessMode) (*v1.PersistentVolume, *v1.PersistentVolumeClaim, error) {
	pvName := PVName(ns, name)
	pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, PVC(ns, name, pvName, modes...), metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create PVC %s/%s: %w", ns, name, err)
	}
	pv, err := client.CoreV1().PersistentVolumes().Create(ctx, PV(pvName, src, pvc, modes...), metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create PV %s: %w", pvName, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pv.Status.Phase = v1.VolumeBound
		updated, err := client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if again, getErr := client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); getErr == nil {
				pv = again
			}
		} else if err == nil {
			pv = updated
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("set PV %s bound: %w", pvName, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc.Status = v1.PersistentVolumeClaimStatus{
			Phase:       v1.ClaimBound,
			AccessModes: pv.Spec.AccessModes,
			Capacity:    pv.Spec.Capacity,
		}
		updated, err := client.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if again, getErr := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{}); getErr == nil {
				pvc = again
			}
		} else if err == nil {
			pvc = updated
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("set PVC %s/%s bound: %w", ns, name, err)
	}
	return pv, pvc, nil
}

func accessModes(modes []v1.PersistentVolumeAccessMode) []v1.PersistentVolumeAccessMode {
	if len(modes) == 0 {
		return []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	}
	return modes
}
