package controller

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestRecover(t *testing.T) {
	pv := csiPV("claim-a", "h1")
	vaName := volume.AttachmentName("h1", driver, "node-1")
	for _, tc := range []struct {
		name    string
		objects []runtime.Object

		// wantActual and wantDesired: the state Recover rebuilds, before any
		// worker runs.
		wantActual, wantDesired []string
		// wantWrites: the API writes the workers make once they run.
		wantWrites []string
	}{
		{
			name: "attachments rebuilt from VolumeAttachments and node status, desired state from pods; nothing detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1"), iscsiName), inUse(csiName("h1"), iscsiName)),
				pv, claim("claim-a"), va("claim-a", "h1", "node-1"), pod("pod-a", "node-1", "claim-a"),
			},
			wantActual:  []string{csiName("h1") + "@node-1 attached reported", iscsiName + "@node-1 attached reported"},
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
		},
		{
			name: "volume a pod still wants, not mounted: kept (and reported)",
			objects: []runtime.Object{
				node("node-1"), pv, claim("claim-a"), va("claim-a", "h1", "node-1"), pod("pod-a", "node-1", "claim-a"),
			},
			wantActual:  []string{csiName("h1") + "@node-1 attached"},
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantWrites:  []string{"patch nodes/status node-1"},
		},
		{
			name:       "orphan VolumeAttachment (attached, managed Ready node, wanted by no pod, not mounted): detached",
			objects:    []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1")},
			wantActual: []string{csiName("h1") + "@node-1 attached"},
			wantWrites: []string{"delete volumeattachments " + vaName},
		},
		{
			name: "orphan listed in node status: withdrawn from the report first, then detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1"))), pv, va("claim-a", "h1", "node-1"),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached reported"},
			wantWrites: []string{"patch nodes/status node-1", "delete volumeattachments " + vaName},
		},
		{
			name: "orphan the node lists in use: nothing detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1")), inUse(csiName("h1"))), pv, va("claim-a", "h1", "node-1"),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached reported"},
		},
		{
			name: "orphan on a node the controller does not manage: not detached",
			objects: []runtime.Object{
				node("node-1", unmanaged), pv, va("claim-a", "h1", "node-1"),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached"},
			// Reported as attached, as upstream reports what it recovers.
			wantWrites: []string{"patch nodes/status node-1"},
		},
		{
			name: "volume of a terminated pod, not mounted: detached",
			objects: []runtime.Object{
				node("node-1", listsAttached(csiName("h1"))), pv, claim("claim-a"), va("claim-a", "h1", "node-1"),
				withPod(pod("pod-a", "node-1", "claim-a"), deleting, containersStopped),
			},
			wantActual: []string{csiName("h1") + "@node-1 attached reported"},
			wantWrites: []string{"patch nodes/status node-1", "delete volumeattachments " + vaName},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects...)
			if err := f.c.Recover(f.ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			checkList(t, "actual state after Recover", f.actualState(), tc.wantActual)
			checkList(t, "desired state after Recover", f.desiredState(), tc.wantDesired)
			checkList(t, "API writes of Recover", f.writes(), nil)
			f.drain()
			checkList(t, "API writes of the workers", f.writes(), tc.wantWrites)
		})
	}
}

// Recover reads the pods in name order, whatever the order of the lister:
// a restart does the same things in the same order (here, the warnings).
func TestRecoverReadsPodsInOrder(t *testing.T) {
	objs := []runtime.Object{node("node-1")}
	var want []string
	for i := range 8 {
		name := fmt.Sprintf("pod-%d", i)
		objs = append(objs, pod(name, "node-1", "claim-"+name))
		want = append(want, fmt.Sprintf(`PersistentVolumeClaim "default/claim-%s" not found`, name))
	}
	f := newFixture(t, objs...)
	if err := f.c.Recover(f.ctx); err != nil {
		t.Fatal(err)
	}
	got := f.takeEvents()
	if len(got) != len(want) {
		t.Fatalf("events %q, want one warning per pod", got)
	}
	for i := range want {
		if !strings.HasSuffix(got[i], want[i]) {
			t.Errorf("event %d: %q, want the warning ending %q", i, got[i], want[i])
		}
	}
}
