package sim

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

// InUse computes node.status.volumesInUse, sorted: the volumes the node's
// running pods use that the node reports attached, i.e. that the simulated
// kubelet has mounted. Once no pod uses a volume it is "unmounted" and drops
// out.
//
// With reportUnattached every volume a pod uses is reported whether attached
// or not, which is what the real kubelet does (it reports its desired state
// as soon as it decides to mount).
func InUse(attached []v1.AttachedVolume, used sets.Set[string], reportUnattached bool) []v1.UniqueVolumeName {
	var inUse []v1.UniqueVolumeName
	if reportUnattached {
		for name := range used {
			inUse = append(inUse, v1.UniqueVolumeName(name))
		}
	} else {
		seen := sets.New[string]()
		for _, a := range attached {
			name := string(a.Name)
			if used.Has(name) && !seen.Has(name) {
				seen.Insert(name)
				inUse = append(inUse, a.Name)
			}
		}
	}
	slices.Sort(inUse)
	return inUse
}

// sameVolumes compares two volume lists as sets: order and duplicates in
// what is already written don't warrant a write.
func sameVolumes(a, b []v1.UniqueVolumeName) bool {
	return sets.New(a...).Equal(sets.New(b...))
}
