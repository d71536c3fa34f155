package controller

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const iscsiName = "kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0"

var iscsiVolume = v1.Volume{Name: "iscsi", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{
	TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", Lun: 0}}}

func TestSyncPod(t *testing.T) {
	pvA := csiPV("claim-a", "h1")
	for _, tc := range []struct {
		name string
		// before, when set, is the world the pod was synced in first: the
		// state the sync under test starts from.
		before []runtime.Object
		// objects are the listers' content at the sync under test.
		objects []runtime.Object
		// attached are the handles attached to node-1 before the sync.
		attached []string
		key      string

		wantDesired []string
		// wantVolumes and wantStatus: keys queued for the reconciler and
		// the node status writer.
		wantVolumes, wantStatus []string
		// wantEvents: each event must start with its line, in order.
		wantEvents []string
	}{
		{
			name:        "running pod with a bound RWO claim wants its volume, single-node",
			objects:     []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name: "RWX PV may attach to many nodes",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"),
				csiPV("claim-a", "h1", v1.ReadWriteMany)},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=false"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name: "PV listing ReadWriteOnce and ReadOnlyMany may attach to many nodes (the PV's modes decide)",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"),
				csiPV("claim-a", "h1", v1.ReadWriteOnce, v1.ReadOnlyMany)},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=false"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "inline iSCSI volume is wanted under its in-tree name",
			objects:     []runtime.Object{node("node-1"), withPod(pod("pod-a", "node-1"), inlineVolume(iscsiVolume))},
			key:         "default/pod-a",
			wantDesired: []string{iscsiName + "@node-1 default/pod-a(uid-pod-a) single=false"},
			wantVolumes: []string{iscsiName + "@node-1"},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "pod gone: its volumes are no longer wanted",
			before:      []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects:     []runtime.Object{node("node-1"), claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:    "unscheduled pod needs nothing",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "", "claim-a"), claim("claim-a"), pvA},
			key:     "default/pod-a",
		},
		{
			name: "pod that Succeeded needs nothing",
			objects: []runtime.Object{node("node-1"), withPod(pod("pod-a", "node-1", "claim-a"), phase(v1.PodSucceeded)),
				claim("claim-a"), pvA},
			key: "default/pod-a",
		},
		{
			name:   "pod that Failed releases its volumes",
			before: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects: []runtime.Object{node("node-1"), withPod(pod("pod-a", "node-1", "claim-a"), phase(v1.PodFailed)),
				claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:   "deleting pod whose containers all stopped releases its volumes",
			before: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects: []runtime.Object{node("node-1"), withPod(pod("pod-a", "node-1", "claim-a"), deleting, containersStopped),
				claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:   "deleting pod with a container still running keeps its volumes",
			before: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects: []runtime.Object{node("node-1"), withPod(pod("pod-a", "node-1", "claim-a"), deleting),
				claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
		},
		{
			// Whether the node counts is Decide's, from the node's facts.
			name:        "pod on a node the controller does not manage: what it wants is recorded, with no warning",
			objects:     []runtime.Object{node("node-1", unmanaged), pod("pod-a", "node-1", "claim-a", "claim-gone"), claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "pod on a node not in the lister: what it wants is recorded, with no warning",
			objects:     []runtime.Object{pod("pod-a", "node-1", "claim-a", "claim-gone"), claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:    "missing claim: a warning, nothing wanted",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), pvA},
			key:     "default/pod-a",
			wantEvents: []string{`Warning FailedAttachVolume AttachVolume.Attach failed for volume "claim-a" : ` +
				`PersistentVolumeClaim "default/claim-a" not found`},
		},
		{
			name:    "unbound claim: waits without a warning",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), unboundClaim("claim-a")},
			key:     "default/pod-a",
		},
		{
			name: "CSI driver that needs no attach: nothing wanted",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA,
				&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}, Spec: storagev1.CSIDriverSpec{AttachRequired: new(false)}}},
			key: "default/pod-a",
		},
		{
			name:        "claim force-deleted under a live pod: the volume stays wanted, with a VolumeKeptAttached warning",
			before:      []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects:     []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), pvA},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantEvents: []string{`Warning VolumeKeptAttached volume "claim-a" stays attached as ` + csiName("h1") +
				` until the pod terminates, but it can no longer be resolved: PersistentVolumeClaim "default/claim-a" not found`},
		},
		{
			name:        "PV deleted under a live pod: the volume stays wanted, with a VolumeKeptAttached warning",
			before:      []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects:     []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a")},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantEvents:  []string{`Warning VolumeKeptAttached volume "claim-a" stays attached as ` + csiName("h1")},
		},
		{
			name: "claim deleted while the controller was down: the volume the pod had, still attached, stays wanted, " +
				"with a VolumeKeptAttached warning",
			objects:     []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), pvA},
			attached:    []string{"h1"},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-1 default/pod-a(uid-pod-a) single=true"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
			wantEvents:  []string{`Warning VolumeKeptAttached volume "claim-a" stays attached as ` + csiName("h1")},
		},
		{
			name:    "claim deleted while the controller was down, volume not attached: nothing kept",
			objects: []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), pvA},
			key:     "default/pod-a",
			wantEvents: []string{`Warning FailedAttachVolume AttachVolume.Attach failed for volume "claim-a" : ` +
				`PersistentVolumeClaim "default/claim-a" not found`},
		},
		{
			name:   "pod re-created under the same name on another node: the new pod wants the volume there, the old node's is released",
			before: []runtime.Object{node("node-1"), node("node-2"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects: []runtime.Object{node("node-1"), node("node-2"), withPod(pod("pod-a", "node-2", "claim-a"), uid("uid-new")),
				claim("claim-a"), pvA},
			key:         "default/pod-a",
			wantDesired: []string{csiName("h1") + "@node-2 default/pod-a(uid-new) single=true"},
			wantVolumes: []string{key("h1", "node-1"), key("h1", "node-2")},
			wantStatus:  []string{"node-1", "node-2"},
		},
		{
			name:        "pod re-created under the same name whose claim is gone: the old pod's volume is not kept for it",
			before:      []runtime.Object{node("node-1"), pod("pod-a", "node-1", "claim-a"), claim("claim-a"), pvA},
			objects:     []runtime.Object{node("node-1"), withPod(pod("pod-a", "node-1", "claim-a"), uid("uid-new")), pvA},
			key:         "default/pod-a",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
			wantEvents: []string{`Warning FailedAttachVolume AttachVolume.Attach failed for volume "claim-a" : ` +
				`PersistentVolumeClaim "default/claim-a" not found`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects...)
			if tc.before != nil {
				f.load(tc.before...)
				if err := f.c.syncPod(f.ctx, tc.key); err != nil {
					t.Fatalf("first sync: %v", err)
				}
				f.reset()
				f.load(tc.objects...)
			}
			for _, h := range tc.attached {
				f.c.actual.Update(cache.Key{Volume: volume.CSIName(driver, h), Node: "node-1"}, true, func(a *cache.Attachment) {
					a.State = cache.Attached
					a.Kind = volume.KindCSI
				})
			}
			if err := f.c.syncPod(f.ctx, tc.key); err != nil {
				t.Fatalf("syncPod: %v", err)
			}
			checkList(t, "desired state", f.desiredState(), tc.wantDesired)
			checkList(t, "volume keys queued", f.queued(QueueVolumes), tc.wantVolumes)
			checkList(t, "node status queued", f.queued(QueueNodeStatus), tc.wantStatus)
			checkEvents(t, f.takeEvents(), tc.wantEvents)
			checkList(t, "API writes", f.writes(), nil)
		})
	}
}

// A problem is told once: the same sync again posts no second warning.
func TestSyncPodWarnsOnce(t *testing.T) {
	f := newFixture(t, node("node-1"), pod("pod-a", "node-1", "claim-a"))
	for range 3 {
		if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.takeEvents(); len(got) != 1 {
		t.Errorf("events after three syncs: %q, want one warning", got)
	}
}

func checkList(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !sameList(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

func checkEvents(t *testing.T, got, want []string) {
	t.Helper()
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.HasPrefix(got[i], want[i])
	}
	if !ok {
		t.Errorf("events:\n got  %q\n want (prefixes) %q", got, want)
	}
}

// A pod's claim that is missing right after the pod's creation (a generic
// ephemeral volume's, before the ephemeral volume controller made it) is
// waited for quietly; the pod is synced again once claimGrace has passed,
// and warned only if it is still missing then.
func TestSyncPodMissingClaimGrace(t *testing.T) {
	ephemeralPod := func() *v1.Pod {
		p := pod("pod-a", "node-1")
		p.CreationTimestamp = metav1.NewTime(epoch)
		p.Spec.Volumes = []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}}
		return p
	}
	ownedClaim := func() *v1.PersistentVolumeClaim {
		c := claim("pod-a-scratch")
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-a", UID: "uid-pod-a", Controller: new(true)}}
		return c
	}
	pvA := csiPV("pod-a-scratch", "h1")
	const warning = `Warning FailedAttachVolume AttachVolume.Attach failed for volume "scratch" : PersistentVolumeClaim "default/pod-a-scratch" not found`
	for _, tc := range []struct {
		name       string
		after      time.Duration // since the pod's creation, at the second sync
		claimMade  bool          // the claim is there at the second sync
		wantEvents []string
	}{
		{name: "still missing after the grace: warned", after: claimGrace, wantEvents: []string{warning}},
		{name: "still missing within the grace: not warned", after: claimGrace - time.Second},
		{name: "made within the grace: never warned, wanted", after: claimGrace / 2, claimMade: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, node("node-1"), ephemeralPod(), pvA)
			if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
				t.Fatal(err)
			}
			checkEvents(t, f.takeEvents(), nil)
			if got := f.queues[QueuePods].after["default/pod-a"]; got != claimGrace {
				t.Errorf("pod synced again after %v, want after the grace, %v", got, claimGrace)
			}
			f.clock.Step(tc.after)
			if tc.claimMade {
				f.load(node("node-1"), ephemeralPod(), ownedClaim(), pvA)
			}
			if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
				t.Fatal(err)
			}
			checkEvents(t, f.takeEvents(), tc.wantEvents)
			if tc.claimMade && len(f.desiredState()) != 1 {
				t.Errorf("desired state %q, want the ephemeral volume", f.desiredState())
			}
		})
	}
}
