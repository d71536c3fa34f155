package controller

import (
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"
)

// Nodes deleted while the controller was down, or while it acted on them:
// what wakes the volumes left on them.

// enforceRole makes the fake API refuse, as RBAC would, every request the
// ClusterRole in file does not grant.
func (f *fixture) enforceRole(file string) {
	f.t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		f.t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &role); err != nil {
		f.t.Fatal(err)
	}
	granted := func(verb, group, resource string) bool {
		for _, r := range role.Rules {
			if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
				return true
			}
		}
		return false
	}
	f.client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		if granted(a.GetVerb(), a.GetResource().Group, res) {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: a.GetResource().Group, Resource: res}, "",
			errors.New("not granted by the ClusterRole"))
	})
}

// The controller runs with the ClusterRole it ships. A node was deleted
// while the controller was down; its VolumeAttachment remains, and the pod
// that used the volume (ReadWriteOnce) now runs on node-2. The restart
// must learn that the node is gone, so that the volume is detached after
// the max wait for unmount and attached to node-2.
func TestVolumeOfANodeDeletedBeforeTheStartIsDetachedUnderTheShippedRole(t *testing.T) {
	objs := []runtime.Object{node("node-2"), csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "gone-1"),
		pod("pod-a", "node-2", "claim-a")}
	f := newFixture(t, objs...)
	f.enforceRole("../../manifests/base/clusterrole.yaml")
	must(t, f.c.Recover(f.ctx))
	f.drain()

	f.clock.Step(time.Hour)
	f.fireTimers(time.Hour)
	// The failed node syncs are retried as often as it takes.
	for range 5 {
		f.queues[QueueNodes].Add("gone-1")
		f.lookAtEverything()
	}
	k := csiKey("h1", "gone-1")
	if got := f.deletedAttachments(); !slices.Contains(got, vaNameOf("h1", "gone-1")) {
		t.Errorf("an hour after the start: VolumeAttachments deleted %v, want gone-1's; decision: %v; node facts: %s; API requests: %v",
			got, f.c.reconciler.Decide(k, f.clock.Now()), f.nodeFacts("gone-1"), f.requests())
	}
}

// requests lists the API requests made since the last reset: "verb
// resource[/subresource]".
func (f *fixture) requests() []string {
	var out []string
	for _, a := range f.client.Actions() {
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		if s := a.GetVerb() + " " + res; !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// node-1 is deleted while the controller's create of a VolumeAttachment
// for it is on its way: the node's worker syncs the deletion (node-1 has
// nothing attached yet, so nothing is kept of it), then the create fails.
// Volumes of deleted nodes are detached at once
// (MaxWaitForUnmountDeletedNode 0).
// The attach of unknown outcome is recorded on node-1. The pod is then
// created again on node-2. The volume (ReadWriteOnce) is held on node-1
// until that record is settled: node-1 is known deleted, the volume may be
// detached after the max wait, and is attached to node-2.
func TestVolumeAttachedAsItsNodeWasDeletedIsNotHeldThereForEver(t *testing.T) {
	vols := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a")}
	n1 := node("node-1")
	// A deleted Node means its machine is gone: its volumes are detached
	// at once.
	zero := time.Duration(0)
	f := newFixtureWith(t, func(c *Config) { c.Reconciler.MaxWaitForUnmountDeletedNode = &zero },
		slices.Concat(vols, []runtime.Object{n1, node("node-2")})...)
	f.syncFirst("node-1", nil)
	f.syncFirst("node-2", nil)
	f.drain()
	f.reset()

	deleted := false
	f.client.PrependReactor("create", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		if deleted {
			return false, nil, nil
		}
		deleted = true
		// Meanwhile, on a node worker: node-1's deletion is read.
		must(t, f.client.Tracker().Delete(nodesGVR, "", "node-1"))
		f.load(slices.Concat(vols, []runtime.Object{node("node-2"), pod("pod-a", "node-1", "claim-a")})...)
		f.c.nodeDeleted(n1)
		for f.c.Process(f.ctx, QueueNodes) {
		}
		return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	})
	// pod-a is scheduled to node-1.
	f.load(slices.Concat(vols, []runtime.Object{n1, node("node-2"), pod("pod-a", "node-1", "claim-a")})...)
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	f.drain()
	if !deleted {
		t.Fatalf("no VolumeAttachment create was tried; writes: %v", f.writes())
	}

	// The pod of the deleted node goes, and is created again on node-2.
	f.load(slices.Concat(vols, []runtime.Object{node("node-2"), pod("pod-a", "node-2", "claim-a")})...)
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	f.drain()

	f.clock.Step(time.Hour)
	f.fireTimers(time.Hour)
	// The failed syncs are retried as often as it takes.
	for range 5 {
		f.lookAtEverything()
		f.lookAt(csiKey("h1", "node-2"))
	}
	if got := f.createdAttachments(); !slices.Contains(got, vaNameOf("h1", "node-2")) {
		t.Errorf("an hour after node-1's deletion: created %v, want h1's VolumeAttachment on node-2; node-2: %v; node-1: %v (node-1 facts %q, exists %v, timers %v)",
			got, f.c.reconciler.Decide(csiKey("h1", "node-2"), f.clock.Now()), f.c.reconciler.Decide(csiKey("h1", "node-1"), f.clock.Now()),
			f.nodeFacts("node-1"), func() bool { n, _ := f.c.actual.Node("node-1"); return n.Exists }(), f.pendingTimers())
	}
}

// Three of a zone's five nodes are deleted while their volumes are being
// detached: the status writes that withdraw the volumes find the nodes
// gone (404), and the informer, after a relist, delivers the deletions as
// tombstones. The zone counts as disrupted while the deletions count (3 of
// 5). Once they stop counting, what was scheduled for then finds the zone
// recovered: the gauge drops to 0 and a ZoneRecovered event says so.
func TestZoneDisruptedByNodesFoundGoneByStatusWritesRecovers(t *testing.T) {
	const maxWait = 6 * time.Minute
	var vols, pods []runtime.Object
	names := []string{"a0", "a1", "a2", "a3", "a4"}
	handles := []string{"h0", "h1", "h2"}
	for i, h := range handles {
		c := "claim-" + h
		vols = append(vols, csiPV(c, h), claim(c), va(c, h, names[i]))
		pods = append(pods, pod("pod-"+h, names[i], c))
	}
	nodes := func(from int) []runtime.Object {
		var out []runtime.Object
		for _, n := range names[from:] {
			out = append(out, node(n, zone("a")))
		}
		return out
	}
	f := newFixtureWith(t, zoneGuard(maxWait, nil), slices.Concat(vols, pods, nodes(0))...)
	for i, n := range names {
		var hs, ps []string
		if i < len(handles) {
			hs, ps = []string{handles[i]}, []string{"default/pod-" + handles[i]}
		}
		f.syncFirst(n, hs, ps...)
	}
	f.drain()
	f.reset()

	// The pods go, and the three nodes; the informer shows the pods gone
	// but still holds the nodes: the withdrawals' status writes find them
	// gone.
	f.load(slices.Concat(vols, nodes(0))...)
	for i, h := range handles {
		must(t, f.client.Tracker().Delete(nodesGVR, "", names[i]))
		must(t, f.c.syncPod(f.ctx, "default/pod-"+h))
	}
	f.drain()
	for _, n := range names[:3] {
		if info, _ := f.c.actual.Node(n); !info.Deleted {
			t.Fatalf("%s not recorded deleted by its status write; writes: %v", n, f.writes())
		}
	}
	// The relist: the deletions come as tombstones.
	f.load(slices.Concat(vols, nodes(3))...)
	for _, n := range names[:3] {
		f.c.nodeDeleted(toolscache.DeletedFinalStateUnknown{Key: n, Obj: node(n, zone("a"))})
	}
	f.drain()
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); got != 1 {
		t.Fatalf("disrupted zones %v with 3 of 5 nodes deleted, want 1", got)
	}
	f.takeEvents()

	// The deletions stop counting: what was scheduled for then runs.
	f.clock.Step(maxWait + 2*time.Second)
	f.fireTimers(maxWait + 2*time.Second)
	f.drain()
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); got != 0 {
		t.Errorf("disrupted zones %v once the deletions stopped counting (2 of 2 nodes ready), want 0; decision for h0: %v; timers: %v",
			got, f.c.reconciler.Decide(csiKey("h0", "a0"), f.clock.Now()), f.pendingTimers())
	}
	if got := eventsWith(f.takeEvents(), "ZoneRecovered"); len(got) != 1 {
		t.Errorf("ZoneRecovered events %q, want one", got)
	}
}
