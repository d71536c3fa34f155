package reconciler

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestSafeToDetach(t *testing.T) {
	k := key(specA, node1)
	inUse := map[volume.Name]bool{specA.Name: true}
	cfg := Config{MaxWaitForUnmount: 6 * time.Minute}
	disabled := Config{MaxWaitForUnmount: 6 * time.Minute, DisableForceDetachOnTimeout: true}
	tests := []struct {
		name      string
		node      cache.NodeInfo
		elapsed   time.Duration // since the detach was first wanted
		cfg       Config
		wantForce string
		wantAfter time.Duration
		wantWait  string // "": may detach
	}{
		{name: "not mounted, healthy", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true}, cfg: cfg},
		{name: "not mounted, not ready", node: cache.NodeInfo{Seen: true, Exists: true}, cfg: cfg},
		{name: "another volume mounted", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, InUse: map[volume.Name]bool{specB.Name: true}}, cfg: cfg},
		{
			name: "mounted, healthy", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, InUse: inUse}, elapsed: time.Hour, cfg: cfg,
			wantWait: "still mounted on node node-1 (in node.status.volumesInUse); waiting for kubelet to unmount it",
		},
		{
			name: "mounted, out of service though ready", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, OutOfService: true, InUse: inUse}, cfg: cfg,
			wantForce: ForceOutOfService,
		},
		{
			name: "mounted, out of service, timeout disabled", node: cache.NodeInfo{Seen: true, Exists: true, OutOfService: true, InUse: inUse}, cfg: disabled,
			wantForce: ForceOutOfService,
		},
		{
			name: "mounted, not ready, just now", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse}, cfg: cfg,
			wantAfter: 6 * time.Minute, wantWait: "still mounted on unhealthy node node-1; forced detach in 6m0s unless it is unmounted",
		},
		{
			name: "mounted, not ready, a second before the max wait", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse},
			elapsed: 6*time.Minute - time.Second, cfg: cfg,
			wantAfter: time.Second, wantWait: "still mounted on unhealthy node node-1; forced detach in 1s unless it is unmounted",
		},
		{
			name: "mounted, not ready, max wait over", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse}, elapsed: 6 * time.Minute, cfg: cfg,
			wantForce: ForceTimeout,
		},
		{
			name: "mounted, node deleted (last seen ready), max wait over", node: cache.NodeInfo{Seen: true, Deleted: true, Ready: true, InUse: inUse},
			elapsed: 7 * time.Minute, cfg: cfg,
			wantForce: ForceTimeout,
		},
		{
			name: "mounted, node deleted, before the max wait", node: cache.NodeInfo{Seen: true, Deleted: true, Ready: true, InUse: inUse},
			elapsed: time.Minute, cfg: cfg,
			wantAfter: 5 * time.Minute, wantWait: "still mounted on unhealthy node node-1; forced detach in 5m0s unless it is unmounted",
		},
		{
			// Deleted before this controller started: nothing says what it
			// has mounted, so anything may be (as upstream assumes).
			name: "node deleted unread, before the max wait", node: cache.NodeInfo{Deleted: true, Zone: cache.UnknownZone},
			elapsed: time.Minute, cfg: cfg,
			wantAfter: 5 * time.Minute, wantWait: "still mounted on unhealthy node node-1; forced detach in 5m0s unless it is unmounted",
		},
		{
			name: "node deleted unread, max wait over", node: cache.NodeInfo{Deleted: true, Zone: cache.UnknownZone}, elapsed: 6 * time.Minute, cfg: cfg,
			wantForce: ForceTimeout,
		},
		{
			// Named by an attachment before its sync: it may exist, be
			// Ready and have the volume mounted. Its sync re-queues it.
			name: "node not read yet", node: cache.NodeInfo{}, elapsed: time.Hour, cfg: cfg,
			wantWait: "node node-1 is not read yet: waiting to learn whether it exists and what it has mounted",
		},
		{
			name: "mounted, not ready, timeout disabled", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse}, elapsed: 24 * time.Hour, cfg: disabled,
			wantWait: "still mounted on unhealthy node node-1 and forced detach on timeout is disabled",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := safeToDetach(k, tt.node, t0, t0.Add(tt.elapsed), tt.cfg, noZone)
			force, after, wait := v.Force, v.After, v.Wait
			if force != tt.wantForce || after != tt.wantAfter || wait != tt.wantWait {
				t.Errorf("safeToDetach = %q, %v, %q; want %q, %v, %q", force, after, wait, tt.wantForce, tt.wantAfter, tt.wantWait)
			}
		})
	}
}

// The wait on a node whose Node object is gone is its own setting; other
// unhealthy nodes keep the max wait for unmount.
func TestSafeToDetachDeletedNode(t *testing.T) {
	k := key(specA, node1)
	inUse := map[volume.Name]bool{specA.Name: true}
	wait := func(d time.Duration) Config {
		return Config{MaxWaitForUnmount: 6 * time.Minute, MaxWaitForUnmountDeletedNode: &d}
	}
	deleted := cache.NodeInfo{Seen: true, Deleted: true, Ready: true, InUse: inUse}
	tests := []struct {
		name      string
		node      cache.NodeInfo
		elapsed   time.Duration
		cfg       Config
		wantForce string
		wantAfter time.Duration
		wantWait  string
	}{
		{name: "deleted, wait 0: at once", node: deleted, cfg: wait(0), wantForce: ForceTimeout},
		{name: "deleted, wait 1m, 30s in", node: deleted, elapsed: 30 * time.Second, cfg: wait(time.Minute),
			wantAfter: 30 * time.Second, wantWait: "still mounted on unhealthy node node-1; forced detach in 30s unless it is unmounted"},
		{name: "deleted, wait 1m, over", node: deleted, elapsed: time.Minute, cfg: wait(time.Minute), wantForce: ForceTimeout},
		{name: "deleted, wait longer than the max wait", node: deleted, elapsed: 7 * time.Minute, cfg: wait(10 * time.Minute),
			wantAfter: 3 * time.Minute, wantWait: "still mounted on unhealthy node node-1; forced detach in 3m0s unless it is unmounted"},
		{name: "never seen (gone before the start), wait 0", node: cache.NodeInfo{Deleted: true, Zone: cache.UnknownZone}, cfg: wait(0), wantForce: ForceTimeout},
		{name: "answered gone by the API, wait 0", node: cache.NodeInfo{Deleted: true, Managed: true}, cfg: wait(0), wantForce: ForceTimeout},
		{name: "not read yet, wait 0: its sync first", node: cache.NodeInfo{}, cfg: wait(0),
			wantWait: "node node-1 is not read yet: waiting to learn whether it exists and what it has mounted"},
		{name: "not ready but existing: the max wait", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse}, elapsed: time.Minute, cfg: wait(0),
			wantAfter: 5 * time.Minute, wantWait: "still mounted on unhealthy node node-1; forced detach in 5m0s unless it is unmounted"},
		{name: "ready and existing: never", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, InUse: inUse}, elapsed: time.Hour, cfg: wait(0),
			wantWait: "still mounted on node node-1 (in node.status.volumesInUse); waiting for kubelet to unmount it"},
		{name: "deleted, forced detach on timeout disabled", node: deleted, elapsed: time.Hour,
			cfg:      Config{MaxWaitForUnmount: 6 * time.Minute, MaxWaitForUnmountDeletedNode: new(time.Duration), DisableForceDetachOnTimeout: true},
			wantWait: "still mounted on unhealthy node node-1 and forced detach on timeout is disabled"},
		{name: "deleted, not mounted", node: cache.NodeInfo{Seen: true, Deleted: true}, cfg: wait(time.Hour)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := safeToDetach(k, tt.node, t0, t0.Add(tt.elapsed), tt.cfg, noZone)
			force, after, wait := v.Force, v.After, v.Wait
			if force != tt.wantForce || after != tt.wantAfter || wait != tt.wantWait {
				t.Errorf("safeToDetach = %q, %v, %q; want %q, %v, %q", force, after, wait, tt.wantForce, tt.wantAfter, tt.wantWait)
			}
		})
	}
}

// A node managed again (its kubelet attached volumes by itself until then):
// a volume it does not list in use may be mounted and not reported yet, so
// it is not detached before KubeletReportGrace; and a volume it lists in
// use gets the max wait for unmount afresh, counted from then, since what
// pods wanted there did not count meanwhile.
func TestSafeToDetachOnANodeManagedAgain(t *testing.T) {
	k := key(specA, node1)
	inUse := map[volume.Name]bool{specA.Name: true}
	cfg := Config{MaxWaitForUnmount: 90 * time.Second}
	// Managed again 5 minutes after the detach was first wanted (t0).
	again := t0.Add(5 * time.Minute)
	tests := []struct {
		name      string
		node      cache.NodeInfo
		since     time.Duration // since the node is managed again
		wantForce string
		wantAfter time.Duration
		wantWait  string // "": may detach
	}{
		{name: "not listed, just now", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, ManagedAgain: again},
			wantAfter: KubeletReportGrace,
			wantWait:  "node node-1 is managed again since 0s: what its kubelet mounted while it attached volumes by itself is in volumesInUse only from its next status update; detach in 30s unless it reports the volume in use"},
		{name: "not listed, 20s later", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, ManagedAgain: again}, since: 20 * time.Second,
			wantAfter: 10 * time.Second,
			wantWait:  "node node-1 is managed again since 20s: what its kubelet mounted while it attached volumes by itself is in volumesInUse only from its next status update; detach in 10s unless it reports the volume in use"},
		{name: "not listed, not ready, just now", node: cache.NodeInfo{Seen: true, Exists: true, ManagedAgain: again}, since: time.Second,
			wantAfter: KubeletReportGrace - time.Second,
			wantWait:  "node node-1 is managed again since 1s: what its kubelet mounted while it attached volumes by itself is in volumesInUse only from its next status update; detach in 29s unless it reports the volume in use"},
		{name: "not listed, after the grace", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, ManagedAgain: again}, since: KubeletReportGrace},
		{name: "not listed, out of service, just now", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, OutOfService: true, ManagedAgain: again}},
		{name: "listed, ready", node: cache.NodeInfo{Seen: true, Exists: true, Ready: true, InUse: inUse, ManagedAgain: again}, since: time.Hour,
			wantWait: "still mounted on node node-1 (in node.status.volumesInUse); waiting for kubelet to unmount it"},
		{name: "listed, not ready: the max wait from the node managed again", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse, ManagedAgain: again},
			since: time.Minute, wantAfter: 30 * time.Second,
			wantWait: "still mounted on unhealthy node node-1; forced detach in 30s unless it is unmounted"},
		{name: "listed, not ready, the max wait over since managed again", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse, ManagedAgain: again},
			since: 90 * time.Second, wantForce: ForceTimeout},
		{name: "listed, out of service", node: cache.NodeInfo{Seen: true, Exists: true, InUse: inUse, OutOfService: true, ManagedAgain: again},
			wantForce: ForceOutOfService},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := safeToDetach(k, tt.node, t0, again.Add(tt.since), cfg, noZone)
			if v.Force != tt.wantForce || v.After != tt.wantAfter || v.Wait != tt.wantWait {
				t.Errorf("safeToDetach = %q, %v, %q; want %q, %v, %q", v.Force, v.After, v.Wait, tt.wantForce, tt.wantAfter, tt.wantWait)
			}
		})
	}
}

func TestSingleNodeAccessConflict(t *testing.T) {
	migrated := &volume.Spec{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI, SingleNode: true}
	tests := []struct {
		name        string
		spec        *volume.Spec
		attachments []cache.Attachment
		want        []cache.Key
	}{
		{name: "multi-node volume attached elsewhere", spec: specX,
			attachments: []cache.Attachment{{Key: key(specX, node1), State: cache.Attached}}},
		{name: "single-node volume attached nowhere", spec: specA},
		{name: "single-node volume attached on this node only", spec: specA,
			attachments: []cache.Attachment{{Key: key(specA, node2), State: cache.Attached}}},
		{name: "another volume attached elsewhere", spec: specA,
			attachments: []cache.Attachment{{Key: key(specB, node1), State: cache.Attached}}},
		{name: "attached elsewhere", spec: specA,
			attachments: []cache.Attachment{{Key: key(specA, node1), State: cache.Attached}},
			want:        []cache.Key{key(specA, node1)}},
		{name: "uncertain elsewhere", spec: specA,
			attachments: []cache.Attachment{{Key: key(specA, node1), State: cache.Uncertain}},
			want:        []cache.Key{key(specA, node1)}},
		{name: "detaching elsewhere", spec: specA,
			attachments: []cache.Attachment{{Key: key(specA, node1), State: cache.Detaching}},
			want:        []cache.Key{key(specA, node1)}},
		{name: "elsewhere under its alias and its name", spec: migrated,
			attachments: []cache.Attachment{
				{Key: cache.Key{Volume: ebsInTree, Node: node1}, State: cache.Attached},
				{Key: cache.Key{Volume: ebsCSI, Node: "node-3"}, State: cache.Uncertain},
				{Key: cache.Key{Volume: ebsCSI, Node: node2}, State: cache.Attached},
			},
			want: []cache.Key{{Volume: ebsInTree, Node: node1}, {Volume: ebsCSI, Node: "node-3"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			actual := cache.NewActualState()
			for _, a := range tt.attachments {
				actual.Update(a.Key, true, func(at *cache.Attachment) { *at = a })
			}
			got := singleNodeAccessConflict(tt.spec, node2, actual)
			sortKeys := func(keys []cache.Key) []cache.Key {
				keys = slices.Clone(keys)
				slices.SortFunc(keys, func(a, b cache.Key) int { return strings.Compare(a.String(), b.String()) })
				return keys
			}
			if len(got) != len(tt.want) || (len(got) > 0 && !reflect.DeepEqual(sortKeys(got), sortKeys(tt.want))) {
				t.Errorf("singleNodeAccessConflict = %v, want %v", got, tt.want)
			}
		})
	}
}

func noZone() cache.ZoneHealth { return cache.ZoneHealth{} }

func TestZoneDisrupted(t *testing.T) {
	cfg := Config{UnhealthyZoneThreshold: 0.55, UnhealthyZoneMinNodes: 3}
	for _, tc := range []struct {
		unhealthy, nodes int
		cfg              Config
		want             bool
	}{
		{1, 10, cfg, false},
		{5, 10, cfg, false},
		{6, 10, cfg, true}, // 60% >= 55%
		{8, 10, cfg, true},
		{2, 2, cfg, false}, // fewer than the minimum: each handled alone
		{1, 2, cfg, false},
		{3, 3, cfg, true},
		{8, 10, Config{UnhealthyZoneMinNodes: 3}, false}, // guard off
		{1, 1, Config{UnhealthyZoneThreshold: 0.55, UnhealthyZoneMinNodes: 1}, true},
		{0, 0, Config{UnhealthyZoneThreshold: 0.55}, false},
	} {
		z := cache.ZoneHealth{Zone: "a", Nodes: tc.nodes, Unhealthy: tc.unhealthy}
		if got := ZoneDisrupted(z, tc.cfg); got != tc.want {
			t.Errorf("%d of %d unhealthy, %+v: disrupted %v, want %v", tc.unhealthy, tc.nodes, tc.cfg, got, tc.want)
		}
	}
}

// A forced detach by timeout is held while the node's zone is disrupted;
// the out-of-service taint and an unmount still act; the wait ends with the
// zone's next expiring deletion.
func TestSafeToDetachHeldByADisruptedZone(t *testing.T) {
	k := key(specA, node1)
	inUse := map[volume.Name]bool{specA.Name: true}
	cfg := Config{MaxWaitForUnmount: 6 * time.Minute, UnhealthyZoneThreshold: 0.55, UnhealthyZoneMinNodes: 3}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0.Add(7 * time.Minute)
	disrupted := func() cache.ZoneHealth {
		return cache.ZoneHealth{Zone: "a", Nodes: 10, Unhealthy: 8, Expires: now.Add(time.Minute), Disrupted: true}
	}
	healthy := func() cache.ZoneHealth { return cache.ZoneHealth{Zone: "a", Nodes: 10, Unhealthy: 1} }
	notReady := cache.NodeInfo{Seen: true, Exists: true, Zone: "a", InUse: inUse}

	v := safeToDetach(k, notReady, t0, now, cfg, disrupted)
	want := `still mounted on unhealthy node node-1; forced detach held: zone "a" is disrupted: 8 of 10 nodes not ready, threshold 55%`
	if v.Force != "" || v.Wait != want || v.After != time.Minute || v.HeldIn == nil {
		t.Errorf("disrupted zone: %+v, want held: %q after 1m", v, want)
	}
	if v := safeToDetach(k, notReady, t0, now, cfg, healthy); v.Force != ForceTimeout {
		t.Errorf("healthy zone: %+v, want a forced detach by timeout", v)
	}
	oos := notReady
	oos.OutOfService = true
	if v := safeToDetach(k, oos, t0, now, cfg, disrupted); v.Force != ForceOutOfService {
		t.Errorf("out of service in a disrupted zone: %+v, want a forced detach at once", v)
	}
	unmounted := notReady
	unmounted.InUse = nil
	if v := safeToDetach(k, unmounted, t0, now, cfg, disrupted); v.Force != "" || v.Wait != "" {
		t.Errorf("unmounted in a disrupted zone: %+v, want a detach", v)
	}
	asked := false
	early := func() cache.ZoneHealth { asked = true; return disrupted() }
	if v := safeToDetach(k, notReady, t0, t0.Add(time.Minute), cfg, early); v.HeldIn != nil || asked {
		t.Errorf("before the max wait: %+v, zone asked %v; want the max wait, the zone not asked", v, asked)
	}
}

// An attach of unknown outcome whose object this controller has not seen
// (recovered from node status alone, after someone deleted its
// VolumeAttachment) is not tried again while another node holds the
// single-node volume: trying again would create it anew. One whose
// VolumeAttachment is seen only has its state checked.
func TestUncertainAttachNotRetriedWhileHeldElsewhere(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		uid  string
		want Action
	}{
		{name: "object not seen", want: Blocked},
		{name: "object seen", uid: "uid-1", want: Attach},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			for _, n := range []string{node1, node2} {
				actual.SetNode(n, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
			}
			desired.SetPod(podA, node1, []*volume.Spec{specA})
			actual.Update(key(specA, node1), true, func(a *cache.Attachment) {
				a.Kind, a.AttachmentUID = volume.KindCSI, tc.uid
			})
			actual.Update(key(specA, node2), true, func(a *cache.Attachment) { a.Kind, a.State = volume.KindCSI, cache.Attached })
			r := New(desired, actual, nodestatus.NewRecord(actual), nil, nil, nil, Config{MaxWaitForUnmount: time.Minute})
			if d := r.Decide(key(specA, node1), now); d.Action != tc.want {
				t.Errorf("decision %v, want %s", d, tc.want)
			}
		})
	}
}

// Once its zone recovers, a node still not Ready gets the max wait again
// from the recovery: a partition heals node by node.
func TestSafeToDetachAfterTheZoneRecovered(t *testing.T) {
	k := key(specA, node1)
	cfg := Config{MaxWaitForUnmount: 6 * time.Minute, UnhealthyZoneThreshold: 0.55, UnhealthyZoneMinNodes: 3}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	notReady := cache.NodeInfo{Seen: true, Exists: true, Zone: "a", InUse: map[volume.Name]bool{specA.Name: true}}
	recovered := t0.Add(10 * time.Minute)
	zone := func() cache.ZoneHealth {
		return cache.ZoneHealth{Zone: "a", Nodes: 10, Unhealthy: 2, Recovered: recovered}
	}
	v := safeToDetach(k, notReady, t0, recovered.Add(time.Minute), cfg, zone)
	if v.Force != "" || v.After != 5*time.Minute || !strings.Contains(v.Wait, "its zone recovered from a disruption 1m0s ago") {
		t.Errorf("a minute after the recovery: %+v, want 5m more", v)
	}
	if v := safeToDetach(k, notReady, t0, recovered.Add(6*time.Minute), cfg, zone); v.Force != ForceTimeout {
		t.Errorf("the max wait after the recovery: %+v, want a forced detach", v)
	}
}

// A detach that started stays out of the node's report whatever the
// decision meanwhile: on a node no longer managed, a pod wanting the volume
// again settles nothing back into the report.
func TestStartedDetachStaysWithdrawn(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	actual.SetNode(node1, cache.NodeInfo{Exists: true, Ready: true}, time.Time{})
	desired.SetPod(podA, node1, []*volume.Spec{specA})
	actual.Update(key(specA, node1), true, func(a *cache.Attachment) {
		a.Kind, a.State, a.Withdrawn, a.DetachStarted = volume.KindCSI, cache.Attached, true, time.Now()
	})
	r := New(desired, actual, nodestatus.NewRecord(actual), nil, record.NewFakeRecorder(10), metrics.New(), Config{MaxWaitForUnmount: time.Minute})
	if _, err := r.Sync(ctx, key(specA, node1)); err != nil {
		t.Fatal(err)
	}
	if a, _ := actual.Get(key(specA, node1)); !a.Withdrawn {
		t.Errorf("%+v: a started detach put back in the report", a)
	}
}

// detachSwap is a mechanism whose delete is answered after the object is
// gone and another of its name is on record.
type detachSwap struct{ actual *cache.ActualState }

func (m detachSwap) Attach(context.Context, *volume.Spec, string) (AttachResult, error) {
	return AttachResult{}, nil
}

func (m detachSwap) Settle(context.Context, cache.Attachment, *volume.Spec) (Settled, error) {
	return Settled{}, nil
}

func (m detachSwap) Detach(_ context.Context, a cache.Attachment) (bool, error) {
	m.actual.Delete(a.Key)
	m.actual.Update(a.Key, true, func(n *cache.Attachment) {
		n.Kind, n.State, n.AttachmentName, n.AttachmentUID = volume.KindCSI, cache.Attached, a.AttachmentName, "uid-new"
	})
	return false, nil
}

// The answer of a delete that comes once the record follows another
// object of that name says nothing of that object.
func TestLateDetachAnswerLeavesANewObjectAlone(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	actual.SetNode(node1, cache.NodeInfo{Exists: true, Managed: true, Ready: true, Seen: true}, time.Time{})
	k := key(specA, node1)
	actual.Update(k, true, func(a *cache.Attachment) {
		a.Kind, a.State, a.AttachmentName, a.AttachmentUID, a.Withdrawn = volume.KindCSI, cache.Attached, "va", "uid-old", true
	})
	r := New(desired, actual, nodestatus.NewRecord(actual), map[volume.Kind]Mechanism{volume.KindCSI: detachSwap{actual}}, record.NewFakeRecorder(10), metrics.New(),
		Config{MaxWaitForUnmount: time.Minute})
	if _, err := r.Sync(ctx, k); err != nil {
		t.Fatal(err)
	}
	if a, _ := actual.Get(k); a.State != cache.Attached || !a.DetachStarted.IsZero() {
		t.Errorf("%+v: the new object taken as being detached", a)
	}
}

// detachGoneThenCreated is a mechanism whose delete finds the object gone,
// and whose answer comes once another object of that name, attached, is on
// record (someone created it again; the informer showed it meanwhile).
type detachGoneThenCreated struct{ actual *cache.ActualState }

func (m detachGoneThenCreated) Attach(context.Context, *volume.Spec, string) (AttachResult, error) {
	return AttachResult{}, nil
}

func (m detachGoneThenCreated) Settle(context.Context, cache.Attachment, *volume.Spec) (Settled, error) {
	return Settled{}, nil
}

func (m detachGoneThenCreated) Detach(_ context.Context, a cache.Attachment) (bool, error) {
	m.actual.Update(a.Key, false, func(n *cache.Attachment) { n.State, n.AttachmentUID = cache.Attached, "uid-new" })
	return true, nil
}

// The answer "gone" of a delete predates the object created again under
// its name meanwhile: the record, which follows the new object, is not
// dropped as detached (nothing would detach that object, nor list it in
// node status); the key is decided again.
func TestGoneDetachAnswerDropsNoRecordChangedMeanwhile(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	actual.SetNode(node1, cache.NodeInfo{Exists: true, Managed: true, Ready: true, Seen: true}, time.Time{})
	k := key(specA, node1)
	actual.Update(k, true, func(a *cache.Attachment) {
		a.Kind, a.State, a.AttachmentName, a.AttachmentUID, a.Withdrawn = volume.KindCSI, cache.Attached, "va", "uid-old", true
	})
	r := New(desired, actual, nodestatus.NewRecord(actual), map[volume.Kind]Mechanism{volume.KindCSI: detachGoneThenCreated{actual}}, record.NewFakeRecorder(10),
		metrics.New(), Config{MaxWaitForUnmount: time.Minute})
	res, err := r.Sync(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := actual.Get(k); !ok {
		t.Fatal("the record of the object created again was dropped as detached")
	}
	if !slices.Contains(res.Wake, k) {
		t.Errorf("result %+v: %v not decided again", res, k)
	}
}
