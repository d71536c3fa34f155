package stack

import (
	"crypto/sha256"
	"encoding/hex"
)

// VolumeAttachmentName is the name the controller gives the
// VolumeAttachment of a CSI volume on a node, as kube-controller-manager
// does; the external-attacher and kubelet look it up by that name.
func VolumeAttachmentName(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

// CSIVolumeName is the unique name of a CSI volume in node.status
// (volumesAttached, volumesInUse).
func CSIVolumeName(driver, handle string) string {
	return "kubernetes.io/csi/" + driver + "^" + handle
}
