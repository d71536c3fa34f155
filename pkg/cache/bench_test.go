package cache_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/cache/cachetest"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The benchmarks run against the world of pkg/cache/cachetest (100,000
// volumes, one pod each): the scale the per-key work must not depend on.

// benchDesired returns a DesiredState with every volume wanted by its pod.
func benchDesired(b *testing.B) *cache.DesiredState {
	b.Helper()
	d := cache.NewDesiredState()
	for v := range cachetest.Volumes {
		d.SetPod(cachetest.Pod(v), cachetest.Node(v/cachetest.PerNode), []*volume.Spec{cachetest.Spec(v)})
	}
	return d
}

// benchActual returns an ActualState with every volume attached, on managed Ready nodes that have all their volumes in use.
func benchActual(b *testing.B) *cache.ActualState {
	b.Helper()
	a := cache.NewActualState()
	for n := range cachetest.Nodes {
		inUse := map[volume.Name]bool{}
		for j := range cachetest.PerNode {
			inUse[cachetest.Spec(n*cachetest.PerNode+j).Name] = true
		}
		a.SetNode(cachetest.Node(n), cache.NodeInfo{Exists: true, Managed: true, Ready: true, InUse: inUse}, time.Time{})
	}
	for v := range cachetest.Volumes {
		cachetest.Attach(a, v)
	}
	return a
}

func BenchmarkDesiredStateSetPod(b *testing.B) {
	d := benchDesired(b)
	b.Run("add+remove", func(b *testing.B) {
		// A new pod with a new volume on an existing node, then its deletion.
		pod, spec, node := cachetest.Pod(cachetest.Volumes), []*volume.Spec{cachetest.Spec(cachetest.Volumes)}, cachetest.Node(0)
		b.ReportAllocs()
		for b.Loop() {
			d.SetPod(pod, node, spec)
			d.SetPod(pod, node, nil)
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		// A pod update that changes nothing the controller reads.
		pod, spec, node := cachetest.Pod(4242), []*volume.Spec{cachetest.Spec(4242)}, cachetest.Node(4242/cachetest.PerNode)
		b.ReportAllocs()
		for b.Loop() {
			if keys := d.SetPod(pod, node, spec); len(keys) != 0 {
				b.Fatalf("unchanged pod touched %v", keys)
			}
		}
	})
}

func BenchmarkDesiredStateKeysFor(b *testing.B) {
	d := benchDesired(b)
	name := cachetest.Spec(4242).Name
	b.ReportAllocs()
	for b.Loop() {
		if keys := d.KeysFor(name); len(keys) != 1 {
			b.Fatalf("KeysFor: %v", keys)
		}
	}
}

func BenchmarkDesiredStateGet(b *testing.B) {
	d := benchDesired(b)
	k := cachetest.Key(4242)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := d.Get(k); !ok {
			b.Fatal("not desired")
		}
	}
}

// BenchmarkDesiredStateStats is the work of one metrics scrape.
func BenchmarkDesiredStateStats(b *testing.B) {
	d := benchDesired(b)
	b.ReportAllocs()
	for b.Loop() {
		d.Stats()
	}
}

func BenchmarkActualStateUpdate(b *testing.B) {
	a := benchActual(b)
	b.Run("existing", func(b *testing.B) {
		// A VolumeAttachment update that changes nothing.
		k := cachetest.Key(4242)
		b.ReportAllocs()
		for b.Loop() {
			a.Update(k, false, func(at *cache.Attachment) { at.State = cache.Attached })
		}
	})
	b.Run("create+delete", func(b *testing.B) {
		k := cache.Key{Volume: cachetest.Spec(cachetest.Volumes).Name, Node: cachetest.Node(0)}
		b.ReportAllocs()
		for b.Loop() {
			a.Update(k, true, func(at *cache.Attachment) { at.AttachmentName = "csi-new" })
			a.Delete(k)
		}
	})
}

func BenchmarkActualStateSetNode(b *testing.B) {
	a := benchActual(b)
	info, _ := a.Node(cachetest.Node(42))
	b.ReportAllocs()
	for b.Loop() {
		if keys, _ := a.SetNode(cachetest.Node(42), info, time.Time{}); len(keys) != 0 {
			b.Fatalf("unchanged node touched %v", keys)
		}
	}
}

func BenchmarkActualStateAttachedElsewhere(b *testing.B) {
	a := benchActual(b)
	names := cachetest.Spec(4242).AllNames()
	b.ReportAllocs()
	for b.Loop() {
		a.AttachedElsewhere(names, cachetest.Node(0))
	}
}

// BenchmarkActualStateStats is the work of one metrics scrape.
func BenchmarkActualStateStats(b *testing.B) {
	a := benchActual(b)
	b.ReportAllocs()
	for b.Loop() {
		a.Stats()
	}
}

// BenchmarkActualStateAttachments is the copy the periodic sync walks.
func BenchmarkActualStateAttachments(b *testing.B) {
	a := benchActual(b)
	b.ReportAllocs()
	for b.Loop() {
		if got := len(a.Attachments()); got != cachetest.Volumes {
			b.Fatalf("%d attachments", got)
		}
	}
}

// BenchmarkStateMemory reports the heap each state holds per volume (specs
// and pod references excluded: the informers' objects and the other state
// share them).
func BenchmarkStateMemory(b *testing.B) {
	specs := make([]*volume.Spec, cachetest.Volumes)
	pods := make([]cache.PodRef, cachetest.Volumes)
	nodes := make([]string, cachetest.Nodes)
	for v := range specs {
		specs[v], pods[v] = cachetest.Spec(v), cachetest.Pod(v)
	}
	for n := range nodes {
		nodes[n] = cachetest.Node(n)
	}
	for _, tc := range []struct {
		name  string
		build func() any
	}{
		{"desired", func() any {
			d := cache.NewDesiredState()
			for v, spec := range specs {
				d.SetPod(pods[v], nodes[v/cachetest.PerNode], []*volume.Spec{spec})
			}
			return d
		}},
		{"actual", func() any {
			a := cache.NewActualState()
			for v, spec := range specs {
				a.Update(cache.Key{Volume: spec.Name, Node: nodes[v/cachetest.PerNode]}, true, func(at *cache.Attachment) {
					at.State = cache.Attached
					at.Spec = spec
				})
			}
			return a
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var perVolume float64
			for b.Loop() {
				before := benchHeap()
				state := tc.build()
				perVolume = float64(benchHeap()-before) / cachetest.Volumes
				runtime.KeepAlive(state)
			}
			b.ReportMetric(perVolume, "heap-B/volume")
		})
	}
}

func benchHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
