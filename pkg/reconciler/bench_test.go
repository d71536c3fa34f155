package reconciler_test

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/cache/cachetest"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The benchmarks decide one key in the world of pkg/cache/cachetest
// (100,000 volumes), every one wanted by its pod and attached: the cost of a
// decision must not grow with the world.

// benchMechanism starts attaches and detaches that never complete, and
// makes no API call.
type benchMechanism struct{}

var _ reconciler.Mechanism = benchMechanism{}

func (benchMechanism) Attach(_ context.Context, spec *volume.Spec, node string) (reconciler.AttachResult, error) {
	return reconciler.AttachResult{AttachmentName: volume.AttachmentName(spec.VolumeHandle, spec.Driver, node)}, nil
}

func (benchMechanism) Detach(context.Context, cache.Attachment) (bool, error) { return false, nil }

func (benchMechanism) Settle(context.Context, cache.Attachment, *volume.Spec) (reconciler.Settled, error) {
	return reconciler.Settled{}, nil
}

// benchWorld returns a Reconciler over 100,000 volumes wanted and attached
// (and reported) on managed Ready nodes that have none in use, plus one
// volume, cachetest.Volumes, attached and wanted by nobody on a node of its own
// (cachetest.Node(cachetest.Nodes), as healthy as the others).
func benchWorld(b *testing.B) (*reconciler.Reconciler, *cache.DesiredState, *cache.ActualState) {
	b.Helper()
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	status := nodestatus.NewRecord(actual)
	for n := range cachetest.Nodes + 1 {
		actual.SetNode(cachetest.Node(n), cache.NodeInfo{Exists: true, Managed: true, Ready: true, InUse: map[volume.Name]bool{}}, time.Time{})
	}
	attach := func(v int) {
		cachetest.Attach(actual, v)
		// Listed in its node's status.
		status.Recover(cachetest.Node(v/cachetest.PerNode), []v1.AttachedVolume{{Name: v1.UniqueVolumeName(cachetest.Spec(v).Name)}})
	}
	for v := range cachetest.Volumes {
		desired.SetPod(cachetest.Pod(v), cachetest.Node(v/cachetest.PerNode), []*volume.Spec{cachetest.Spec(v)})
		attach(v)
	}
	attach(cachetest.Volumes)
	m := metrics.New()
	r := reconciler.New(desired, actual, status, map[volume.Kind]reconciler.Mechanism{volume.KindCSI: benchMechanism{}},
		&record.FakeRecorder{}, m, reconciler.Config{MaxWaitForUnmount: 6 * time.Minute})
	return r, desired, actual
}

func BenchmarkDecide(b *testing.B) {
	r, desired, _ := benchWorld(b)
	now := time.Now()
	// A new pod wants a volume nobody has attached: the single-node check
	// looks for it on other nodes.
	newVolume := cachetest.Volumes + 1
	desired.SetPod(cache.PodRef{Namespace: "bench", Name: "new", UID: "new"}, cachetest.Node(7), []*volume.Spec{cachetest.Spec(newVolume)})
	for _, tc := range []struct {
		name string
		key  cache.Key
		want reconciler.Action
	}{
		{"attached", cachetest.Key(4242), reconciler.Nothing},
		{"not-attached", cache.Key{Volume: cachetest.Spec(newVolume).Name, Node: cachetest.Node(7)}, reconciler.Attach},
		{"not-wanted", cachetest.Key(cachetest.Volumes), reconciler.Withdraw},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if d := r.Decide(tc.key, now); d.Action != tc.want {
					b.Fatalf("decided %s, want %s", d, tc.want)
				}
			}
		})
	}
}

// BenchmarkSync is a worker's whole sync of one key, with a mechanism that
// does nothing: what a key costs besides its API calls.
func BenchmarkSync(b *testing.B) {
	r, desired, _ := benchWorld(b)
	ctx := context.Background()
	newVolume := cachetest.Volumes + 1
	desired.SetPod(cache.PodRef{Namespace: "bench", Name: "new", UID: "new"}, cachetest.Node(7), []*volume.Spec{cachetest.Spec(newVolume)})
	for _, tc := range []struct {
		name string
		key  cache.Key
	}{
		// Nothing to do: a re-queued key whose volume is attached.
		{"attached", cachetest.Key(4242)},
		// An attach under way: the mechanism is asked again.
		{"attaching", cache.Key{Volume: cachetest.Spec(newVolume).Name, Node: cachetest.Node(7)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Sync(ctx, tc.key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
