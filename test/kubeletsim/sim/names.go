package sim

import (
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

// Plugin names of the in-tree volume sources kubelet names itself. The
// migratable ones are those of k8s.io/csi-translation-lib/plugins.
const (
	csiPluginName       = "kubernetes.io/csi"
	iscsiPluginName     = "kubernetes.io/iscsi"
	fcPluginName        = "kubernetes.io/fc"
	awsEBSPluginName    = "kubernetes.io/aws-ebs"
	gcePDPluginName     = "kubernetes.io/gce-pd"
	azureDiskPluginName = "kubernetes.io/azure-disk"
	azureFilePluginName = "kubernetes.io/azure-file"
	cinderPluginName    = "kubernetes.io/cinder"
	vspherePluginName   = "kubernetes.io/vsphere-volume"
	portworxPluginName  = "kubernetes.io/portworx-volume"
)

// errNotAttachable marks a volume that is never attached (hostPath, nfs,
// configMap, azureFile, inline CSI, ...): it has no name to report.
var errNotAttachable = errors.New("not attachable")

// Namer computes the unique volume names a pod's volumes have on a node, the
// way kubelet does. It only reads its listers.
type Namer struct {
	PVCs corelisters.PersistentVolumeClaimLister
	PVs  corelisters.PersistentVolumeLister
	// Migrated holds the in-tree plugins (e.g. "kubernetes.io/aws-ebs")
	// handled through CSI on the node: their volumes get the translated CSI
	// name. Other in-tree volumes keep their in-tree name.
	Migrated sets.Set[string]

	translator csitrans.CSITranslator
}

// PodVolumeNames returns the unique names of the attachable volumes pod uses
// on its node. A volume that can't be named yet (claim missing or unbound,
// PV missing, malformed source) is left out; why is returned in skipped,
// one error per volume, for the caller to log.
func (n *Namer) PodVolumeNames(logger klog.Logger, pod *v1.Pod) (names sets.Set[string], skipped []error) {
	names = sets.New[string]()
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		name, err := n.volumeName(logger, pod, vol)
		switch {
		case errors.Is(err, errNotAttachable):
		case err != nil:
			skipped = append(skipped, fmt.Errorf("pod %s/%s volume %q: %w", pod.Namespace, pod.Name, vol.Name, err))
		default:
			names.Insert(name)
		}
	}
	return names, skipped
}

func (n *Namer) volumeName(logger klog.Logger, pod *v1.Pod, vol *v1.Volume) (string, error) {
	var claimName string
	switch {
	case vol.PersistentVolumeClaim != nil:
		claimName = vol.PersistentVolumeClaim.ClaimName
	case vol.Ephemeral != nil:
		claimName = pod.Name + "-" + vol.Name
	default:
		return n.inlineName(logger, pod, vol)
	}

	pvc, err := n.PVCs.PersistentVolumeClaims(pod.Namespace).Get(claimName)
	if err != nil {
		return "", fmt.Errorf("get claim %s: %w", claimName, err)
	}
	if vol.Ephemeral != nil && !ownedBy(pvc, pod) {
		return "", fmt.Errorf("claim %s is not owned by the pod", claimName)
	}
	// Kubelet (and the attach/detach controller) only use bound claims.
	if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" {
		return "", fmt.Errorf("claim %s is not bound (phase %q, volumeName %q)", claimName, pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	pv, err := n.PVs.Get(pvc.Spec.VolumeName)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("claim %s: PersistentVolume %s not found", claimName, pvc.Spec.VolumeName)
		}
		return "", fmt.Errorf("claim %s: get PersistentVolume %s: %w", claimName, pvc.Spec.VolumeName, err)
	}
	return n.pvName(logger, pv)
}

func ownedBy(pvc *v1.PersistentVolumeClaim, pod *v1.Pod) bool {
	ref := metav1.GetControllerOf(pvc)
	return ref != nil && ref.UID == pod.UID
}

// pvName names a PersistentVolume's source.
func (n *Namer) pvName(logger klog.Logger, pv *v1.PersistentVolume) (string, error) {
	s := &pv.Spec.PersistentVolumeSource
	if s.CSI != nil {
		return csiName(s.CSI.Driver, s.CSI.VolumeHandle)
	}
	if n.translator.IsPVMigratable(pv) {
		plugin, err := n.translator.GetInTreePluginNameFromSpec(pv, nil)
		if err != nil {
			return "", fmt.Errorf("PersistentVolume %s: %w", pv.Name, err)
		}
		if plugin == azureFilePluginName {
			return "", errNotAttachable
		}
		if n.Migrated.Has(plugin) {
			csiPV, err := n.translator.TranslateInTreePVToCSI(logger, pv)
			if err != nil {
				return "", fmt.Errorf("translate PersistentVolume %s to CSI: %w", pv.Name, err)
			}
			return translatedName(csiPV)
		}
	}
	switch {
	case s.AWSElasticBlockStore != nil:
		return inTreeName(awsEBSPluginName, s.AWSElasticBlockStore.VolumeID)
	case s.GCEPersistentDisk != nil:
		return inTreeName(gcePDPluginName, s.GCEPersistentDisk.PDName)
	case s.AzureDisk != nil:
		return inTreeName(azureDiskPluginName, s.AzureDisk.DataDiskURI)
	case s.Cinder != nil:
		return inTreeName(cinderPluginName, s.Cinder.VolumeID)
	case s.VsphereVolume != nil:
		return inTreeName(vspherePluginName, s.VsphereVolume.VolumePath)
	case s.PortworxVolume != nil:
		return inTreeName(portworxPluginName, s.PortworxVolume.VolumeID)
	case s.ISCSI != nil:
		return iscsiName(s.ISCSI.TargetPortal, s.ISCSI.IQN, s.ISCSI.Lun)
	case s.FC != nil:
		return fcName(s.FC)
	default:
		return "", errNotAttachable
	}
}

// inlineName names a volume given inline in the pod.
func (n *Namer) inlineName(logger klog.Logger, pod *v1.Pod, vol *v1.Volume) (string, error) {
	s := &vol.VolumeSource
	if n.translator.IsInlineMigratable(vol) {
		plugin, err := n.translator.GetInTreePluginNameFromSpec(nil, vol)
		if err != nil {
			return "", err
		}
		if plugin == azureFilePluginName {
			return "", errNotAttachable
		}
		if n.Migrated.Has(plugin) {
			csiPV, err := n.translator.TranslateInTreeInlineVolumeToCSI(logger, vol, pod.Namespace)
			if err != nil {
				return "", fmt.Errorf("translate to CSI: %w", err)
			}
			return translatedName(csiPV)
		}
	}
	switch {
	case s.AWSElasticBlockStore != nil:
		return inTreeName(awsEBSPluginName, s.AWSElasticBlockStore.VolumeID)
	case s.GCEPersistentDisk != nil:
		return inTreeName(gcePDPluginName, s.GCEPersistentDisk.PDName)
	case s.AzureDisk != nil:
		return inTreeName(azureDiskPluginName, s.AzureDisk.DataDiskURI)
	case s.Cinder != nil:
		return inTreeName(cinderPluginName, s.Cinder.VolumeID)
	case s.VsphereVolume != nil:
		return inTreeName(vspherePluginName, s.VsphereVolume.VolumePath)
	case s.PortworxVolume != nil:
		return inTreeName(portworxPluginName, s.PortworxVolume.VolumeID)
	case s.ISCSI != nil:
		return iscsiName(s.ISCSI.TargetPortal, s.ISCSI.IQN, s.ISCSI.Lun)
	case s.FC != nil:
		return fcName(s.FC)
	default:
		// Includes inline CSI volumes: they are never attached.
		return "", errNotAttachable
	}
}

func translatedName(pv *v1.PersistentVolume) (string, error) {
	if pv.Spec.CSI == nil {
		return "", fmt.Errorf("translated PersistentVolume %s has no CSI source", pv.Name)
	}
	return csiName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle)
}

// csiName is the CSI plugin's name: "kubernetes.io/csi/<driver>^<handle>".
func csiName(driver, handle string) (string, error) {
	if driver == "" || handle == "" {
		return "", fmt.Errorf("CSI source needs a driver (%q) and a volumeHandle (%q)", driver, handle)
	}
	return csiPluginName + "/" + driver + "^" + handle, nil
}

// inTreeName is "<plugin>/<id>", id being what the plugin's GetVolumeName
// returned.
func inTreeName(plugin, id string) (string, error) {
	if id == "" {
		return "", fmt.Errorf("%s source has an empty volume id", plugin)
	}
	return plugin + "/" + id, nil
}

// iscsiName follows the iSCSI plugin: "<targetPortal>:<iqn>:<lun>".
func iscsiName(portal, iqn string, lun int32) (string, error) {
	if portal == "" || iqn == "" {
		return "", fmt.Errorf("iscsi source needs targetPortal (%q) and iqn (%q)", portal, iqn)
	}
	return inTreeName(iscsiPluginName, fmt.Sprintf("%s:%s:%d", portal, iqn, lun))
}

// fcName follows the FC plugin of Kubernetes v1.37 to the letter: it formats
// the whole slice with %v, so the name is "[wwn1 wwn2]:<lun>", or
// "[wwid1 ...]" when only WWIDs are set.
func fcName(fc *v1.FCVolumeSource) (string, error) {
	switch {
	case len(fc.TargetWWNs) != 0 && fc.Lun != nil:
		return inTreeName(fcPluginName, fmt.Sprintf("%v:%v", fc.TargetWWNs, *fc.Lun))
	case len(fc.WWIDs) != 0:
		return inTreeName(fcPluginName, fmt.Sprintf("%v", fc.WWIDs))
	default:
		return "", errors.New("fc source needs targetWWNs and lun, or wwids")
	}
}
