package volume

import (
	"crypto/sha256"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
	csiplugins "k8s.io/csi-translation-lib/plugins"
)

// Plugin names of the in-tree sources that are never migrated to CSI; the
// migratable ones are named by k8s.io/csi-translation-lib/plugins.
const (
	ISCSIPluginName = "kubernetes.io/iscsi"
	FCPluginName    = "kubernetes.io/fc"
)

// ErrNotAttachable says a volume source needs no attach (nfs, hostPath,
// configMap, azureFile, an inline CSI volume, ...): the controller ignores it.
var ErrNotAttachable = errors.New("volume source needs no attach")

// CSIName is the unique name of a CSI volume, as the kubelet's CSI plugin
// builds it: "kubernetes.io/csi/<driver>^<handle>".
func CSIName(driver, handle string) Name {
	return Name(CSIPluginName + "/" + driver + "^" + handle)
}

// AttachmentName is the name of the VolumeAttachment that attaches a CSI
// volume to a node. It must equal the name kube-controller-manager gives it,
// or a restart under the other controller would attach the volume twice.
func AttachmentName(handle, driver, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

// inTreeName builds "<plugin>/<id>" as upstream's GetUniqueVolumeNameFromSpec.
func inTreeName(plugin, id string) Name {
	return Name(plugin + "/" + id)
}

// InTreeName returns the plugin and unique name of an attachable volume
// source: the PV's when pv is set, else the inline volume's. The id part is
// what the upstream in-tree plugin's GetVolumeName returns, because kubelet
// computes the same name and waits for it in node.status.volumesAttached.
//
// A CSI PV yields CSIPluginName and its CSIName. Sources that need no attach
// return an error wrapping ErrNotAttachable; a malformed attachable source
// returns a descriptive error instead.
func InTreeName(pv *v1.PersistentVolume, inline *v1.Volume) (plugin string, name Name, err error) {
	switch {
	case pv != nil:
		return pvName(pv)
	case inline != nil:
		return inlineName(inline)
	default:
		return "", "", errors.New("neither a PersistentVolume nor an inline volume given")
	}
}

func pvName(pv *v1.PersistentVolume) (string, Name, error) {
	s := &pv.Spec.PersistentVolumeSource
	what := "PersistentVolume " + pv.Name
	switch {
	case s.CSI != nil:
		if s.CSI.Driver == "" || s.CSI.VolumeHandle == "" {
			return "", "", fmt.Errorf("%s: CSI source needs both driver (%q) and volumeHandle (%q)", what, s.CSI.Driver, s.CSI.VolumeHandle)
		}
		return CSIPluginName, CSIName(s.CSI.Driver, s.CSI.VolumeHandle), nil
	case s.AWSElasticBlockStore != nil:
		return idName(what, csiplugins.AWSEBSInTreePluginName, "volumeID", s.AWSElasticBlockStore.VolumeID)
	case s.GCEPersistentDisk != nil:
		return idName(what, csiplugins.GCEPDInTreePluginName, "pdName", s.GCEPersistentDisk.PDName)
	case s.AzureDisk != nil:
		return idName(what, csiplugins.AzureDiskInTreePluginName, "diskURI", s.AzureDisk.DataDiskURI)
	case s.Cinder != nil:
		return idName(what, csiplugins.CinderInTreePluginName, "volumeID", s.Cinder.VolumeID)
	case s.VsphereVolume != nil:
		return idName(what, csiplugins.VSphereInTreePluginName, "volumePath", s.VsphereVolume.VolumePath)
	case s.PortworxVolume != nil:
		return idName(what, csiplugins.PortworxVolumePluginName, "volumeID", s.PortworxVolume.VolumeID)
	case s.ISCSI != nil:
		return iscsiName(what, s.ISCSI.TargetPortal, s.ISCSI.IQN, s.ISCSI.Lun)
	case s.FC != nil:
		return fcName(what, s.FC)
	case *s == (v1.PersistentVolumeSource{}):
		return "", "", fmt.Errorf("%s has no volume source", what)
	default:
		return "", "", fmt.Errorf("%s: %w", what, ErrNotAttachable)
	}
}

func inlineName(vol *v1.Volume) (string, Name, error) {
	s := &vol.VolumeSource
	what := "volume " + vol.Name
	switch {
	case s.AWSElasticBlockStore != nil:
		return idName(what, csiplugins.AWSEBSInTreePluginName, "volumeID", s.AWSElasticBlockStore.VolumeID)
	case s.GCEPersistentDisk != nil:
		return idName(what, csiplugins.GCEPDInTreePluginName, "pdName", s.GCEPersistentDisk.PDName)
	case s.AzureDisk != nil:
		return idName(what, csiplugins.AzureDiskInTreePluginName, "diskURI", s.AzureDisk.DataDiskURI)
	case s.Cinder != nil:
		return idName(what, csiplugins.CinderInTreePluginName, "volumeID", s.Cinder.VolumeID)
	case s.VsphereVolume != nil:
		return idName(what, csiplugins.VSphereInTreePluginName, "volumePath", s.VsphereVolume.VolumePath)
	case s.PortworxVolume != nil:
		return idName(what, csiplugins.PortworxVolumePluginName, "volumeID", s.PortworxVolume.VolumeID)
	case s.ISCSI != nil:
		return iscsiName(what, s.ISCSI.TargetPortal, s.ISCSI.IQN, s.ISCSI.Lun)
	case s.FC != nil:
		return fcName(what, s.FC)
	case s.PersistentVolumeClaim != nil, s.Ephemeral != nil:
		// Attachability belongs to the PV behind the claim, not to the pod.
		return "", "", fmt.Errorf("%s refers to a claim: resolve its PersistentVolume first", what)
	default:
		// Includes inline CSI (ephemeral) volumes: upstream never attaches them.
		return "", "", fmt.Errorf("%s: %w", what, ErrNotAttachable)
	}
}

func idName(what, plugin, field, id string) (string, Name, error) {
	if id == "" {
		return "", "", fmt.Errorf("%s: %s source has an empty %s", what, plugin, field)
	}
	return plugin, inTreeName(plugin, id), nil
}

// iscsiName follows the iSCSI plugin's GetVolumeName: "<portal>:<iqn>:<lun>".
func iscsiName(what, portal, iqn string, lun int32) (string, Name, error) {
	if portal == "" || iqn == "" {
		return "", "", fmt.Errorf("%s: iscsi source needs both targetPortal (%q) and iqn (%q)", what, portal, iqn)
	}
	return ISCSIPluginName, inTreeName(ISCSIPluginName, fmt.Sprintf("%s:%s:%d", portal, iqn, lun)), nil
}

// fcName follows the FC plugin's GetVolumeName, which formats the whole
// slice with %v: "[wwn1 wwn2]:<lun>", or "[wwid1 ...]" when only WWIDs are
// set. kubelet computes the same string, so it must not be "tidied".
func fcName(what string, fc *v1.FCVolumeSource) (string, Name, error) {
	switch {
	case len(fc.TargetWWNs) != 0 && fc.Lun != nil:
		return FCPluginName, inTreeName(FCPluginName, fmt.Sprintf("%v:%d", fc.TargetWWNs, *fc.Lun)), nil
	case len(fc.WWIDs) != 0:
		return FCPluginName, inTreeName(FCPluginName, fmt.Sprintf("%v", fc.WWIDs)), nil
	default:
		return "", "", fmt.Errorf("%s: fc source needs targetWWNs with lun, or wwids", what)
	}
}
