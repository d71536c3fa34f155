package controller

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestSyncNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before, when set, is the node the controller synced first.
		before *v1.Node
		// attached are the handles attached to node-1 before the sync.
		attached []string
		objects  []runtime.Object
		// deleted, when set, is the node's last state as the informer's
		// delete carries it.
		deleted *v1.Node
		key     string

		wantFacts                         string
		wantPods, wantVolumes, wantStatus []string
	}{
		{
			name:      "new node: its facts are recorded and its pods queued",
			objects:   []runtime.Object{node("node-1"), pod("pod-a", "node-1"), pod("pod-b", "node-2")},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
			wantPods:  []string{"default/pod-a"},
		},
		{
			name:      "known node, nothing changed: nothing queued",
			before:    node("node-1"),
			attached:  []string{"h1"},
			objects:   []runtime.Object{node("node-1", resourceVersion("11")), pod("pod-a", "node-1")},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
		},
		{
			name:        "node turns NotReady: its attachments are queued",
			before:      node("node-1"),
			attached:    []string{"h1"},
			objects:     []runtime.Object{node("node-1", notReady, resourceVersion("11"))},
			key:         "node-1",
			wantFacts:   "exists,managed inUse=[]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "out-of-service taint: its attachments are queued",
			before:      node("node-1", notReady),
			attached:    []string{"h1"},
			objects:     []runtime.Object{node("node-1", notReady, outOfService, resourceVersion("11"))},
			key:         "node-1",
			wantFacts:   "exists,managed,out-of-service inUse=[]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "one volume unmounted: only its attachment is queued",
			before:      node("node-1", inUse(csiName("h1"), csiName("h2"))),
			attached:    []string{"h1", "h2"},
			objects:     []runtime.Object{node("node-1", inUse(csiName("h2")), resourceVersion("11"))},
			key:         "node-1",
			wantFacts:   "exists,managed,ready inUse=[" + csiName("h2") + "]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:     "deleted node: what it had mounted last is kept, its attachments and pods are queued",
			before:   node("node-1"),
			attached: []string{"h1"},
			objects:  []runtime.Object{pod("pod-a", "node-1")},
			// Mounted in an update the controller never synced.
			deleted:     node("node-1", inUse(csiName("h1")), resourceVersion("11")),
			key:         "node-1",
			wantFacts:   "managed inUse=[" + csiName("h1") + "]",
			wantPods:    []string{"default/pod-a"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:       "node status lists a volume the controller did not write: the status is rewritten",
			objects:    []runtime.Object{node("node-1", listsAttached(csiName("h9")))},
			key:        "node-1",
			wantFacts:  "exists,managed,ready inUse=[]",
			wantStatus: []string{"node-1"},
		},
		{
			name:     "stale node object, older than the one the controller knows: skipped",
			before:   node("node-1", resourceVersion("20")),
			attached: []string{"h1"},
			// Older than the controller's own status write's answer: its
			// readiness and its volumesAttached are both out of date.
			objects:   []runtime.Object{node("node-1", notReady, listsAttached(csiName("h9")), resourceVersion("15"))},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
		},
		{
			name:      "node becomes managed: its pods are queued",
			before:    node("node-1", unmanaged),
			objects:   []runtime.Object{node("node-1", resourceVersion("11")), pod("pod-a", "node-1")},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
			wantPods:  []string{"default/pod-a"},
		},
		{
			name:      "node gone before the controller ever read it: nothing known, its pods queued",
			objects:   []runtime.Object{pod("pod-a", "node-1")},
			key:       "node-1",
			wantFacts: "unknown",
			wantPods:  []string{"default/pod-a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects...)
			if tc.before != nil {
				f.load(tc.before)
				if err := f.c.syncNode(f.ctx, tc.key); err != nil {
					t.Fatalf("first sync: %v", err)
				}
			}
			for _, h := range tc.attached {
				f.c.actual.Update(cache.Key{Volume: volume.CSIName(driver, h), Node: "node-1"}, true, func(a *cache.Attachment) {
					a.State = cache.Attached
					a.Kind = volume.KindCSI
				})
			}
			f.load(tc.objects...)
			if tc.deleted != nil {
				f.c.nodeDeleted(tc.deleted)
			}
			f.reset()
			if err := f.c.syncNode(f.ctx, tc.key); err != nil {
				t.Fatalf("syncNode: %v", err)
			}
			if got := f.nodeFacts(tc.key); got != tc.wantFacts {
				t.Errorf("node facts: got %q, want %q", got, tc.wantFacts)
			}
			checkList(t, "pods queued", f.queued(QueuePods), tc.wantPods)
			checkList(t, "volume keys queued", f.queued(QueueVolumes), tc.wantVolumes)
			checkList(t, "node status queued", f.queued(QueueNodeStatus), tc.wantStatus)
			checkList(t, "API writes", f.writes(), nil)
		})
	}
}
