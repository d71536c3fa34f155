package nodestatus

import (
	"context"

	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	node = "node-1"
	volA = volume.Name("kubernetes.io/csi/d.example.com^a")
	volB = volume.Name("kubernetes.io/csi/d.example.com^b")
	volC = volume.Name("kubernetes.io/csi/d.example.com^c")
	volD = volume.Name("kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0")
)

func key(v volume.Name) cache.Key { return cache.Key{Volume: v, Node: node} }

func av(v volume.Name, devicePath string) v1.AttachedVolume {
	return v1.AttachedVolume{Name: v1.UniqueVolumeName(v), DevicePath: devicePath}
}

func sortKeys(keys []cache.Key) []cache.Key {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, func(a, b cache.Key) int { return strings.Compare(a.String(), b.String()) })
	return keys
}

type fixture struct {
	client *fake.Clientset
	actual *cache.ActualState
	record *Record
	writer *Writer
}

// newFixture builds a Writer over a fake clientset holding nodes, with
// attachments in the actual state and listed in the record (what the node's
// status lists as far as the controller knows, as at start).
func newFixture(t *testing.T, nodes []*v1.Node, attachments []cache.Attachment, listed []v1.AttachedVolume, patchErr error) *fixture {
	t.Helper()
	objs := make([]runtime.Object, 0, len(nodes))
	for _, n := range nodes {
		objs = append(objs, n)
	}
	client := fake.NewClientset(objs...)
	if patchErr != nil {
		client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, patchErr
		})
	}
	actual := cache.NewActualState()
	actual.SetNode(node, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
	for _, a := range attachments {
		actual.Update(a.Key, true, func(at *cache.Attachment) { *at = a })
	}
	record := NewRecord(actual)
	record.Recover(node, listed)
	setNode := func(_ context.Context, n *v1.Node) []cache.Key {
		keys, _ := actual.SetNode(n.Name, testFacts(n), time.Time{})
		return keys
	}
	return &fixture{client: client, actual: actual, record: record, writer: NewWriter(client, record, setNode)}
}

func TestWriterSync(t *testing.T) {
	n1 := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	tests := []struct {
		name        string
		nodes       []*v1.Node
		attachments []cache.Attachment
		listed      []v1.AttachedVolume // what node status lists at start
		patchErr    error

		wantPatch  string // "": no patch
		wantErr    string
		wantKeys   []cache.Key
		wantListed []v1.AttachedVolume
		wantInNode []v1.AttachedVolume // node.status.volumesAttached after the sync, when patched
	}{
		{
			name:  "one patch of the status subresource with the full sorted list",
			nodes: []*v1.Node{n1},
			attachments: []cache.Attachment{
				{Key: key(volD), State: cache.Attached, DevicePath: "/dev/sdb"},
				{Key: key(volB), State: cache.Attached},
				{Key: key(volA), State: cache.Attached},
				{Key: key(volC), State: cache.Uncertain},
				{Key: key("kubernetes.io/csi/d.example.com^w"), State: cache.Attached, Withdrawn: true},
				{Key: cache.Key{Volume: volA, Node: "node-2"}, State: cache.Attached},
			},
			listed: []v1.AttachedVolume{av(volB, ""), av("kubernetes.io/csi/d.example.com^w", "")},
			wantPatch: `{"status":{"volumesAttached":[` +
				`{"name":"kubernetes.io/csi/d.example.com^a","devicePath":""},` +
				`{"name":"kubernetes.io/csi/d.example.com^b","devicePath":""},` +
				`{"name":"kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0","devicePath":"/dev/sdb"}]}}`,
			wantKeys:   []cache.Key{key(volA), key(volD), key("kubernetes.io/csi/d.example.com^w")},
			wantListed: []v1.AttachedVolume{av(volA, ""), av(volB, ""), av(volD, "/dev/sdb")},
			wantInNode: []v1.AttachedVolume{av(volA, ""), av(volB, ""), av(volD, "/dev/sdb")},
		},
		{
			name:        "empty list is written as null",
			nodes:       []*v1.Node{n1},
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached, Withdrawn: true}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			wantPatch:   `{"status":{"volumesAttached":null}}`,
			wantKeys:    []cache.Key{key(volA)},
			wantListed:  nil,
			wantInNode:  nil,
		},
		{
			name:        "nothing changed: no patch",
			nodes:       []*v1.Node{n1},
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached}, {Key: key(volB), State: cache.Uncertain}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			wantListed:  []v1.AttachedVolume{av(volA, "")},
		},
		{
			// The lister does not know the node (deleted, or created again
			// and not seen yet): only the API's NotFound says nothing is
			// listed; a re-created Node may carry what a write put there.
			name:        "node unknown to the lister: patched anyway, NotFound confirms the empty report",
			patchErr:    apierrors.NewNotFound(v1.Resource("nodes"), node),
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached, Withdrawn: true}, {Key: key(volB), State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			wantPatch:   `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^b","devicePath":""}]}}`,
			// Every attachment of the gone node: what it had mounted is
			// unknown now; A also for its confirmed withdrawal.
			wantKeys: []cache.Key{key(volA), key(volA), key(volB)},
		},
		{
			name:        "node deleted since the lister saw it: empty report confirmed",
			nodes:       []*v1.Node{n1},
			patchErr:    apierrors.NewNotFound(v1.Resource("nodes"), node),
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached, Withdrawn: true}, {Key: key(volB), State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			wantPatch:   `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^b","devicePath":""}]}}`,
			// Every attachment of the gone node: what it had mounted is
			// unknown now; A also for its confirmed withdrawal.
			wantKeys: []cache.Key{key(volA), key(volA), key(volB)},
		},
		{
			name:        "patch fails: error, withdrawn volume still reported",
			nodes:       []*v1.Node{n1},
			patchErr:    errors.New("connection refused"),
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached, Withdrawn: true}, {Key: key(volB), State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			wantPatch:   `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^b","devicePath":""}]}}`,
			wantErr:     "patch node node-1 status: connection refused",
			// B counts as listed (the write may have landed); A is
			// returned because its detach waits on this write.
			wantKeys:   []cache.Key{key(volA), key(volB)},
			wantListed: []v1.AttachedVolume{av(volA, ""), av(volB, "")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.nodes, tt.attachments, tt.listed, tt.patchErr)
			_, ctx := ktesting.NewTestContext(t)
			keys, _, err := f.writer.Sync(ctx, node)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Errorf("error %q, want %q", gotErr, tt.wantErr)
			}
			if len(keys) != len(tt.wantKeys) || (len(keys) > 0 && !reflect.DeepEqual(sortKeys(keys), sortKeys(tt.wantKeys))) {
				t.Errorf("keys %v, want %v", keys, tt.wantKeys)
			}
			if got := f.record.Listed(node); !reflect.DeepEqual(got, tt.wantListed) {
				t.Errorf("listed %v, want %v", got, tt.wantListed)
			}
			if f.record.InFlight(node) {
				t.Errorf("write still in flight after Sync")
			}
			var patches []k8stesting.PatchAction
			for _, a := range f.client.Actions() {
				p, ok := a.(k8stesting.PatchAction)
				if !ok {
					t.Errorf("unexpected API call %v", a)
					continue
				}
				patches = append(patches, p)
			}
			if tt.wantPatch == "" {
				if len(patches) != 0 {
					t.Errorf("patches %v, want none", patches)
				}
				return
			}
			if len(patches) != 1 {
				t.Fatalf("%d patches, want 1", len(patches))
			}
			p := patches[0]
			if p.GetResource().Resource != "nodes" || p.GetName() != node || p.GetSubresource() != "status" || p.GetPatchType() != types.MergePatchType {
				t.Errorf("patch of %s %s/%s type %s, want a merge patch of nodes %s/status",
					p.GetResource().Resource, p.GetName(), p.GetSubresource(), p.GetPatchType(), node)
			}
			if got := string(p.GetPatch()); got != tt.wantPatch {
				t.Errorf("patch\n %s\nwant\n %s", got, tt.wantPatch)
			}
			if tt.patchErr != nil {
				return
			}
			got, err := f.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Status.VolumesAttached, tt.wantInNode) {
				t.Errorf("node.status.volumesAttached = %v, want %v", got.Status.VolumesAttached, tt.wantInNode)
			}
		})
	}
}

// TestWriterRetriesFailedWrite: after a failed patch the next Sync writes
// again, even though the volume already counts as reported.
func TestWriterRetriesFailedWrite(t *testing.T) {
	tests := []struct {
		name        string
		attachments []cache.Attachment
		listed      []v1.AttachedVolume
		wantPatch   string
	}{
		{
			name:        "added volume",
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached}},
			wantPatch:   `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^a","devicePath":""}]}}`,
		},
		{
			name:        "withdrawn volume",
			attachments: []cache.Attachment{{Key: key(volA), State: cache.Attached, Withdrawn: true}},
			listed:      []v1.AttachedVolume{av(volA, "")},
			wantPatch:   `{"status":{"volumesAttached":null}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: node}}}, tt.attachments, tt.listed, nil)
			failing := true
			f.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
				if failing {
					return true, nil, errors.New("timeout")
				}
				return false, nil, nil
			})
			_, ctx := ktesting.NewTestContext(t)
			if _, _, err := f.writer.Sync(ctx, node); err == nil {
				t.Fatalf("first Sync: no error from a failed patch")
			}
			failing = false
			if _, _, err := f.writer.Sync(ctx, node); err != nil {
				t.Fatalf("second Sync: %v", err)
			}
			actions := f.client.Actions()
			if len(actions) != 2 {
				t.Fatalf("API calls %v, want two patches", actions)
			}
			if got := string(actions[1].(k8stesting.PatchAction).GetPatch()); got != tt.wantPatch {
				t.Errorf("second patch %s, want %s", got, tt.wantPatch)
			}
		})
	}
}

// A write whose answer comes from a Node object the controller has seen
// replaced since (deleted and created again under its name, the new one read
// first) confirms nothing: the new object lists nothing of it, and its
// status is written again.
func TestWriterWriteLandedOnReplacedNode(t *testing.T) {
	old := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "old", ResourceVersion: "10"}}
	f := newFixture(t, []*v1.Node{old}, []cache.Attachment{{Key: key(volA), State: cache.Attached}}, nil, nil)
	_, ctx := ktesting.NewTestContext(t)
	// The write begins while the controller knows the old object; the
	// new one is read before the answer comes.
	f.actual.SetNode(node, cache.NodeInfo{Managed: true, Ready: true, UID: "old", ResourceVersion: "10"}, time.Time{})
	f.client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		f.actual.SetNode(node, cache.NodeInfo{Managed: true, Ready: true, UID: "new", ResourceVersion: "20"}, time.Time{})
		return false, nil, nil
	})
	if _, _, err := f.writer.Sync(ctx, node); err == nil {
		t.Errorf("Sync of a write that landed on the replaced Node: no error")
	}
	if err := f.client.Tracker().Delete(v1.SchemeGroupVersion.WithResource("nodes"), "", node); err != nil {
		t.Fatal(err)
	}
	renewed := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "new", ResourceVersion: "20"}}
	if err := f.client.Tracker().Add(renewed); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.writer.Sync(ctx, node); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	got, err := f.client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []v1.AttachedVolume{av(volA, "")}; !reflect.DeepEqual(got.Status.VolumesAttached, want) {
		t.Errorf("status of the Node created again lists %v, want %v", got.Status.VolumesAttached, want)
	}
	if n, _, _ := f.record.Unsettled(10); n != 0 {
		t.Errorf("%d unsettled after the write to the Node created again, want 0", n)
	}
}

// A write that only adds volumes waits for the attaches under way on the
// node: no patch, and the time until the caller syncs the node again; then
// one patch carries what attached meanwhile.
func TestWriterSyncHolds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFixture(t, []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: node}}}, []cache.Attachment{
		{Key: key(volA), State: cache.Attached},
		{Key: key(volB), State: cache.Uncertain},
	}, nil, nil)
	clk := clocktesting.NewFakePassiveClock(t0)
	f.writer.Hold, f.writer.Clock = time.Second, clk
	_, ctx := ktesting.NewTestContext(t)

	keys, after, err := f.writer.Sync(ctx, node)
	if err != nil || len(keys) != 0 || after != time.Second {
		t.Fatalf("Sync = %v, %v, %v; want no keys, 1s, no error", keys, after, err)
	}
	if actions := f.client.Actions(); len(actions) != 0 {
		t.Fatalf("API calls %v while the write waits, want none", actions)
	}
	clk.SetTime(t0.Add(400 * time.Millisecond))
	f.actual.Update(key(volB), false, func(a *cache.Attachment) { a.State = cache.Attached })
	keys, after, err = f.writer.Sync(ctx, node)
	if err != nil || after != 0 {
		t.Fatalf("Sync once nothing is under way = %v, %v; want a write", after, err)
	}
	if !reflect.DeepEqual(sortKeys(keys), []cache.Key{key(volA), key(volB)}) {
		t.Errorf("keys %v, want both volumes (now reported)", keys)
	}
	actions := f.client.Actions()
	if len(actions) != 1 {
		t.Fatalf("API calls %v, want one patch", actions)
	}
	want := `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^a","devicePath":""},{"name":"kubernetes.io/csi/d.example.com^b","devicePath":""}]}}`
	if got := string(actions[0].(k8stesting.PatchAction).GetPatch()); got != want {
		t.Errorf("patch %s, want %s", got, want)
	}

	// An attach that never completes holds a write for Hold at most.
	volE := volume.Name("kubernetes.io/csi/d.example.com^e")
	f.actual.Update(key(volC), true, func(a *cache.Attachment) { a.State = cache.Uncertain })
	f.actual.Update(key(volE), true, func(a *cache.Attachment) { a.State = cache.Attached })
	if _, after, _ := f.writer.Sync(ctx, node); after != time.Second {
		t.Fatalf("Sync with %s attached and %s under way: wait %v, want 1s", volE, volC, after)
	}
	clk.SetTime(t0.Add(1400 * time.Millisecond))
	if _, after, err := f.writer.Sync(ctx, node); after != 0 || err != nil {
		t.Fatalf("Sync after the wait = %v, %v; want a write", after, err)
	}
	actions = f.client.Actions()
	if len(actions) != 2 {
		t.Fatalf("API calls %v, want 2 patches", actions)
	}
	want = `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^a","devicePath":""},{"name":"kubernetes.io/csi/d.example.com^b","devicePath":""},{"name":"kubernetes.io/csi/d.example.com^e","devicePath":""}]}}`
	if got := string(actions[1].(k8stesting.PatchAction).GetPatch()); got != want {
		t.Errorf("patch %s, want %s (not %s, still under way)", got, want, volC)
	}
}

func TestPatch(t *testing.T) {
	tests := []struct {
		name string
		want []v1.AttachedVolume
		json string
	}{
		{name: "nil", want: nil, json: `{"status":{"volumesAttached":null}}`},
		{name: "empty", want: []v1.AttachedVolume{}, json: `{"status":{"volumesAttached":null}}`},
		{name: "two", want: []v1.AttachedVolume{av(volA, ""), av(volD, "/dev/sdb")},
			json: `{"status":{"volumesAttached":[{"name":"kubernetes.io/csi/d.example.com^a","devicePath":""},` +
				`{"name":"kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0","devicePath":"/dev/sdb"}]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Patch(tt.want)
			if err != nil || string(b) != tt.json {
				t.Errorf("Patch = %s, %v; want %s", b, err, tt.json)
			}
		})
	}
}

// testFacts reads what the writer's tests need of a node: its version and
// UID.
func testFacts(n *v1.Node) cache.NodeInfo {
	return cache.NodeInfo{Exists: true, Managed: true, Ready: true, ResourceVersion: n.ResourceVersion, UID: string(n.UID)}
}

// A write of a move (budget.Move) waits for no other attach on the node: a
// pod waits for the volume that changed nodes.
func TestWriterSyncMoveHoldsNothing(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := newFixture(t, []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: node}}}, []cache.Attachment{
		{Key: key(volA), State: cache.Attached},
		{Key: key(volB), State: cache.Uncertain},
	}, nil, nil)
	f.writer.Hold, f.writer.Clock = time.Second, clocktesting.NewFakePassiveClock(t0)
	_, ctx := ktesting.NewTestContext(t)
	keys, after, err := f.writer.Sync(budget.WithPriority(ctx, budget.Move), node)
	if err != nil || after != 0 {
		t.Fatalf("Sync of a move = %v, %v; want a write now", after, err)
	}
	if !reflect.DeepEqual(keys, []cache.Key{key(volA)}) {
		t.Errorf("keys %v, want %s (now reported)", keys, volA)
	}
	if actions := f.client.Actions(); len(actions) != 1 {
		t.Fatalf("API calls %v, want one patch", actions)
	}
}
