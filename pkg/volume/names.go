package volume

import (
	"crypto/sha256"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"
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
	if s.CSI != nil {
		if s.CSI.Driver == "" || s.CSI.VolumeHandle == "" {
			return "", "", fmt.Errorf("%s: CSI source needs both driver (%q) and volumeHandle (%q)", what, s.CSI.Driver, s.CSI.VolumeHandle)
		}
		return CSIPluginName, CSIName(s.CSI.Driver, s.CSI.VolumeHandle), nil
	}
	if p, src := pvPlugin(s); src != nil {
		return sourceName(what, p, src)
	}
	if *s == (v1.PersistentVolumeSource{}) {
		return "", "", fmt.Errorf("%s has no volume source", what)
	}
	return "", "", fmt.Errorf("%s: %w", what, ErrNotAttachable)
}

func inlineName(vol *v1.Volume) (string, Name, error) {
	s := &vol.VolumeSource
	what := "volume " + vol.Name
	if p, src := inlinePlugin(s); src != nil {
		return sourceName(what, p, src)
	}
	if s.PersistentVolumeClaim != nil || s.Ephemeral != nil {
		// Attachability belongs to the PV behind the claim, not to the pod.
		return "", "", fmt.Errorf("%s refers to a claim: resolve its PersistentVolume first", what)
	}
	// Includes inline CSI (ephemeral) volumes: upstream never attaches them.
	return "", "", fmt.Errorf("%s: %w", what, ErrNotAttachable)
}

// sourceName is the unique name of one plugin's source.
func sourceName(what string, p InTreePlugin, src *pluginSource) (string, Name, error) {
	switch {
	case p.NoAttach:
		return "", "", fmt.Errorf("%s: %w", what, ErrNotAttachable)
	case src.problem != "":
		return "", "", fmt.Errorf("%s: %s", what, src.problem)
	}
	return p.Name, inTreeName(p.Name, src.id), nil
}
