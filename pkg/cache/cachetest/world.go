// Package cachetest builds the world the benchmarks of pkg/cache,
// pkg/nodestatus and pkg/reconciler run against: Nodes x PerNode
// ReadWriteOnce CSI volumes, one pod each, the scale the per-key and
// per-node work must not depend on.
package cachetest

import (
	"fmt"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	Nodes   = 10_000
	PerNode = 10
	Volumes = Nodes * PerNode // 100,000
	Driver  = "bench.csi.example.com"
)

// Node is node i's name.
func Node(i int) string { return fmt.Sprintf("node-%05d", i) }

// Spec is volume v: a ReadWriteOnce CSI PV.
func Spec(v int) *volume.Spec {
	handle := fmt.Sprintf("vol-%06d", v)
	return &volume.Spec{
		Name:         volume.CSIName(Driver, handle),
		Kind:         volume.KindCSI,
		PluginName:   volume.CSIPluginName,
		Driver:       Driver,
		VolumeHandle: handle,
		PVName:       "pv-" + handle,
		SingleNode:   true,
	}
}

// Key is volume v on its node.
func Key(v int) cache.Key { return cache.Key{Volume: Spec(v).Name, Node: Node(v / PerNode)} }

// Pod is the pod that wants volume v.
func Pod(v int) cache.PodRef {
	return cache.PodRef{Namespace: "bench", Name: fmt.Sprintf("pod-%06d", v), UID: fmt.Sprintf("uid-%06d", v)}
}

// Attach records volume v attached to its node by the CSI mechanism.
func Attach(a *cache.ActualState, v int) {
	spec := Spec(v)
	a.Update(Key(v), true, func(at *cache.Attachment) {
		at.State = cache.Attached
		at.Kind = volume.KindCSI
		at.PluginName = volume.CSIPluginName
		at.Spec = spec
		at.AttachmentName = volume.AttachmentName(spec.VolumeHandle, spec.Driver, Node(v/PerNode))
	})
}
