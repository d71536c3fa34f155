package volume

import v1 "k8s.io/api/core/v1"

// ClaimName is the PersistentVolumeClaim a pod volume uses, or "": the
// claim it names, or, for a generic ephemeral volume, <pod>-<volume>.
func ClaimName(p *v1.Pod, vol *v1.Volume) string {
	switch {
	case vol.PersistentVolumeClaim != nil:
		return vol.PersistentVolumeClaim.ClaimName
	case vol.Ephemeral != nil:
		return p.Name + "-" + vol.Name
	}
	return ""
}
