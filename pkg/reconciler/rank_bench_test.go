package reconciler

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/cache/cachetest"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// rankWorld is pkg/cache/cachetest's 100,000 volumes, wanted, attached and
// listed; plus one volume attached and wanted by nobody, withdrawn, on a
// node of its own.
func rankWorld(b *testing.B) (*Reconciler, *cache.DesiredState, *cache.ActualState) {
	b.Helper()
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	status := nodestatus.NewRecord(actual)
	for n := range cachetest.Nodes + 1 {
		actual.SetNode(cachetest.Node(n), cache.NodeInfo{Exists: true, Managed: true, Ready: true, InUse: map[volume.Name]bool{}}, time.Time{})
	}
	for v := range cachetest.Volumes {
		desired.SetPod(cachetest.Pod(v), cachetest.Node(v/cachetest.PerNode), []*volume.Spec{cachetest.Spec(v)})
		cachetest.Attach(actual, v)
		status.Recover(cachetest.Node(v/cachetest.PerNode), []v1.AttachedVolume{{Name: v1.UniqueVolumeName(cachetest.Spec(v).Name)}})
	}
	cachetest.Attach(actual, cachetest.Volumes)
	actual.Update(cachetest.Key(cachetest.Volumes), false, func(a *cache.Attachment) { a.Withdrawn = true })
	r := New(desired, actual, status, nil, nil, nil, Config{MaxWaitForUnmount: 6 * time.Minute})
	return r, desired, actual
}

// Rank next to what the queues asked before it (Urgent: Wanted || awaited),
// at 100,000 volumes: a wanted key, a teardown's key, a node status write.
// Neither may grow with the world.
func BenchmarkRank(b *testing.B) {
	r, _, _ := rankWorld(b)
	urgent := func(k cache.Key) bool { return r.Wanted(k) || r.awaited(k) }
	wanted, teardown := cachetest.Key(4242), cachetest.Key(cachetest.Volumes)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"Rank/wanted", func() { r.Rank(wanted) }},
		{"Urgent/wanted", func() { urgent(wanted) }},
		{"Rank/teardown", func() { r.Rank(teardown) }},
		{"Urgent/teardown", func() { urgent(teardown) }},
		{"NodeRank/attached", func() { r.NodeRank(wanted.Node) }},
		{"NodeRank/withdrawn", func() { r.NodeRank(teardown.Node) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tc.f()
			}
		})
	}
}

// A volume many nodes share (a ReadWriteMany CSI volume of a DaemonSet, on
// n nodes) being torn down: the rank of each of its keys no pod wants here
// reads every node that still wants it (awaited walks KeysFor and asks each
// key's spec whether it is single-node, which no key of a shared volume
// is), so the teardown ranks in n*n; each Rank runs under the work queue's
// lock (Push/Touch). The spec of the attachment says at once that it is
// shared. This was so before (Urgent); it shows here as the cost per key
// growing with n.
func BenchmarkRankSharedVolume(b *testing.B) {
	for _, n := range []int{100, 1000, 5000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			status := nodestatus.NewRecord(actual)
			spec := &volume.Spec{Name: volume.CSIName("d.example.com", "shared"), Kind: volume.KindCSI, PluginName: volume.CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "shared", PVName: "pv-shared"}
			for i := range n {
				node := fmt.Sprintf("node-%05d", i)
				actual.SetNode(node, cache.NodeInfo{Exists: true, Managed: true, Ready: true}, time.Time{})
				actual.Update(cache.Key{Volume: spec.Name, Node: node}, true, func(a *cache.Attachment) {
					a.State, a.Kind, a.Spec = cache.Attached, volume.KindCSI, spec
				})
				if i > 0 { // node 0's pod is gone
					desired.SetPod(cache.PodRef{Namespace: "ds", Name: node, UID: node}, node, []*volume.Spec{spec})
				}
			}
			r := New(desired, actual, status, nil, nil, nil, Config{MaxWaitForUnmount: 6 * time.Minute})
			k := cache.Key{Volume: spec.Name, Node: "node-00000"}
			b.ReportAllocs()
			for b.Loop() {
				r.Rank(k)
			}
		})
	}
}
