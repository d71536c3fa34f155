package sim

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func attached(names ...string) []v1.AttachedVolume {
	var out []v1.AttachedVolume
	for _, n := range names {
		out = append(out, v1.AttachedVolume{Name: v1.UniqueVolumeName(n)})
	}
	return out
}

func unique(names ...string) []v1.UniqueVolumeName {
	var out []v1.UniqueVolumeName
	for _, n := range names {
		out = append(out, v1.UniqueVolumeName(n))
	}
	return out
}

func TestSameVolumes(t *testing.T) {
	tests := []struct {
		a, b []v1.UniqueVolumeName
		want bool
	}{
		{nil, nil, true},
		{nil, unique(), true},
		{unique("a", "b"), unique("b", "a"), true},
		{unique("a", "a"), unique("a"), true},
		{unique("a"), unique("a", "b"), false},
		{unique("a"), nil, false},
	}
	for _, tc := range tests {
		if got := sameVolumes(tc.a, tc.b); got != tc.want {
			t.Errorf("sameVolumes(%v, %v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

const volA = "kubernetes.io/csi/mock.csi.example.com^4"

// lifecycleOptions: one node, the status loop left to the test (tick).
func lifecycleOptions() *Options {
	opts := NewOptions()
	opts.NodePrefix = "n-"
	opts.NoCSINode = true
	opts.StatusUpdateFrequency = time.Hour
	return opts
}

func pvA() *v1.PersistentVolume {
	return pvWith("pv-a", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.example.com", VolumeHandle: "4"}})
}

func podNamed(name string, uid types.UID, vols ...v1.Volume) *v1.Pod {
	p := podWith(vols...)
	p.Name, p.UID = name, uid
	p.Status.Phase = v1.PodRunning
	return p
}

// tick runs one status update of node n-0, as its status loop does.
func tick(t *testing.T, ctx context.Context, s *Simulator) {
	t.Helper()
	if err := s.updateStatus(ctx, "n-0"); err != nil {
		t.Fatal(err)
	}
}

func isMounted(s *Simulator, name string) bool {
	k := s.kubelets["n-0"]
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.mounted[name].Len() > 0
}

func wantInUse(t *testing.T, ctx context.Context, client *fake.Clientset, want ...string) {
	t.Helper()
	got, err := inUseOf(ctx, client, "n-0")
	if err != nil {
		t.Fatal(err)
	}
	if !sameVolumes(got, unique(want...)) {
		t.Fatalf("volumesInUse = %v, want %v", got, want)
	}
}

// waitStarted waits for the first status update after the start.
func waitStarted(t *testing.T, ctx context.Context, s *Simulator) {
	t.Helper()
	eventually(t, ctx, "first status update", func() (bool, error) {
		k := s.kubelets["n-0"]
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.populated, nil
	})
}

// The order of kubelet's events for one volume: in use before it is
// attached, mounted only once both listed in use and attached, a graceful
// delete (phase Succeeded, unmount, pod deleted, then out of volumesInUse at
// the next status update), and a pod deleted at once (in use until
// unmounted and the next status update).
func TestVolumeLifecycle(t *testing.T) {
	client, ctx, s, stop := startSimulator(t, lifecycleOptions(), pvA(), boundPVC("c-a", "pv-a"))
	defer stop()
	waitStarted(t, ctx, s)

	// A pod arrives: its volume is in use only once a status update ran.
	if _, err := client.CoreV1().Pods(ns).Create(ctx, podNamed("p1", "uid-1", claimVol("a", "c-a")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod read", func() (bool, error) {
		_, ok, err := s.pods.GetByKey(ns + "/p1")
		return ok, err
	})
	wantInUse(t, ctx, client)
	// Attached, but not reported in use yet: not mounted.
	setAttached(t, ctx, client, "n-0", volA)
	time.Sleep(200 * time.Millisecond) // nothing is to happen: no event to wait for
	if isMounted(s, volA) {
		t.Fatal("mounted before volumesInUse listed it")
	}
	setAttached(t, ctx, client, "n-0")
	tick(t, ctx, s)
	wantInUse(t, ctx, client, volA) // in use, not attached
	time.Sleep(200 * time.Millisecond)
	if isMounted(s, volA) {
		t.Fatal("mounted before volumesAttached listed it")
	}
	setAttached(t, ctx, client, "n-0", volA)
	eventually(t, ctx, "mounted", func() (bool, error) { return isMounted(s, volA), nil })

	// A graceful delete.
	client.ClearActions()
	p1, err := client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p1.DeletionTimestamp = new(metav1.Now())
	if _, err := client.CoreV1().Pods(ns).Update(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod gone", func() (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	succeeded, deleted := -1, -1
	for i, a := range client.Actions() {
		switch {
		case a.GetVerb() == "update" && a.GetResource().Resource == "pods" && a.GetSubresource() == "status":
			if a.(k8stesting.UpdateAction).GetObject().(*v1.Pod).Status.Phase == v1.PodSucceeded && succeeded < 0 {
				succeeded = i
			}
		case a.GetVerb() == "delete" && a.GetResource().Resource == "pods":
			deleted = i
		}
	}
	if succeeded < 0 || deleted < succeeded {
		t.Errorf("pod Succeeded at action %d, deleted at %d: want Succeeded first", succeeded, deleted)
	}
	if isMounted(s, volA) {
		t.Error("pod gone, its volume still mounted")
	}
	wantInUse(t, ctx, client, volA) // pod gone, volume still in use
	tick(t, ctx, s)
	wantInUse(t, ctx, client)

	// A pod deleted at once: in use until unmounted and reported.
	if _, err := client.CoreV1().Pods(ns).Create(ctx, podNamed("p2", "uid-2", claimVol("a", "c-a")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod read", func() (bool, error) {
		_, ok, err := s.pods.GetByKey(ns + "/p2")
		return ok, err
	})
	tick(t, ctx, s)
	eventually(t, ctx, "mounted again", func() (bool, error) { return isMounted(s, volA), nil })
	if err := client.CoreV1().Pods(ns).Delete(ctx, "p2", metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "unmounted", func() (bool, error) { return !isMounted(s, volA), nil })
	wantInUse(t, ctx, client, volA)
	tick(t, ctx, s)
	wantInUse(t, ctx, client)
}

// After a restart, what node status says is mounted stays in use; a volume
// in use and not attached drops out for one status update.
func TestRestartKeepsMounted(t *testing.T) {
	const volB = "kubernetes.io/csi/mock.csi.example.com^5"
	pvB := pvWith("pv-b", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.example.com", VolumeHandle: "5"}})
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n-0"},
		Status: v1.NodeStatus{
			Conditions:      []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
			VolumesInUse:    unique(volA, volB),
			VolumesAttached: attached(volA),
		},
	}
	client, ctx, s, stop := startSimulator(t, lifecycleOptions(), node, pvA(), pvB, boundPVC("c-a", "pv-a"), boundPVC("c-b", "pv-b"),
		podNamed("p1", "uid-1", claimVol("a", "c-a")), podNamed("p2", "uid-2", claimVol("b", "c-b")))
	defer stop()
	waitStarted(t, ctx, s)
	if !isMounted(s, volA) || isMounted(s, volB) {
		t.Fatalf("mounted after the restart: A %v, B %v; want A only", isMounted(s, volA), isMounted(s, volB))
	}
	wantInUse(t, ctx, client, volA)
	tick(t, ctx, s)
	wantInUse(t, ctx, client, volA, volB)
}

// A volume found mounted at start whose pod is gone is unmounted, and
// leaves volumesInUse only at the status update after that.
func TestRestartUnmountsWhatNoPodUses(t *testing.T) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n-0"},
		Status: v1.NodeStatus{
			Conditions:      []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
			VolumesInUse:    unique(volA),
			VolumesAttached: attached(volA),
		},
	}
	client, ctx, s, stop := startSimulator(t, lifecycleOptions(), node, pvA(), boundPVC("c-a", "pv-a"))
	defer stop()
	waitStarted(t, ctx, s)
	eventually(t, ctx, "unmounted", func() (bool, error) { return !isMounted(s, volA), nil })
	tick(t, ctx, s)
	wantInUse(t, ctx, client)
}

// The status loop writes volumesInUse on its own, every period.
func TestStatusLoop(t *testing.T) {
	opts := lifecycleOptions()
	opts.StatusUpdateFrequency = 200 * time.Millisecond
	client, ctx, s, stop := startSimulator(t, opts, pvA(), boundPVC("c-a", "pv-a"), podNamed("p1", "uid-1", claimVol("a", "c-a")))
	defer stop()
	waitStarted(t, ctx, s)
	eventually(t, ctx, "volume in use", func() (bool, error) {
		got, err := inUseOf(ctx, client, "n-0")
		return sameVolumes(got, unique(volA)), err
	})
}
