package nodestatus_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/cache/cachetest"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The benchmarks run against the world of pkg/cache/cachetest (100,000
// volumes): the scale the per-node work must not depend on.

// benchRecord returns an ActualState with every volume attached on managed
// Ready nodes that have all their volumes in use, and a record in which
// every node's status lists its volumes.
func benchRecord(b *testing.B) (*cache.ActualState, *nodestatus.Record) {
	b.Helper()
	a := cache.NewActualState()
	r := nodestatus.NewRecord(a)
	for n := range cachetest.Nodes {
		inUse := map[volume.Name]bool{}
		var listed []v1.AttachedVolume
		for j := range cachetest.PerNode {
			name := cachetest.Spec(n*cachetest.PerNode + j).Name
			inUse[name] = true
			listed = append(listed, v1.AttachedVolume{Name: v1.UniqueVolumeName(name)})
		}
		a.SetNode(cachetest.Node(n), cache.NodeInfo{Exists: true, Managed: true, Ready: true, InUse: inUse}, time.Time{})
		r.Recover(cachetest.Node(n), listed)
	}
	for v := range cachetest.Volumes {
		cachetest.Attach(a, v)
	}
	return a, r
}

func BenchmarkRecordBegin(b *testing.B) {
	a, r := benchRecord(b)
	node := cachetest.Node(42)
	b.Run("unchanged", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, changed := r.Begin(node); changed {
				b.Fatal("report changed")
			}
		}
	})
	b.Run("changed+End", func(b *testing.B) {
		// One volume withdrawn, the report written; then back.
		k := cachetest.Key(42 * cachetest.PerNode)
		b.ReportAllocs()
		for b.Loop() {
			for _, withdrawn := range []bool{true, false} {
				a.Update(k, false, func(at *cache.Attachment) { at.Withdrawn = withdrawn })
				want, changed := r.Begin(node)
				if !changed {
					b.Fatal("report unchanged")
				}
				r.End(node, want, true)
			}
		}
	})
}
