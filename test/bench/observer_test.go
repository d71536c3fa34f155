package bench

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

func TestExpectationNames(t *testing.T) {
	w := NewWorkload("t", "d.example.com", 2, 2)
	e := w.Expect(w.All())
	if e.Volumes() != 4 {
		t.Fatalf("%d volumes expected, want 4", e.Volumes())
	}
	// The contract's name: csi- + sha256(handle + driver + node), here of
	// "t-vol-00000" + "d.example.com" + "t-node-0000" (sha256sum).
	if name := "csi-af989db65d652392d59ae2ffa9371602b6a4a04fd9a64ce46a9e4eb66483c5e8"; !e.vas[name] {
		t.Errorf("VolumeAttachment %s not expected: %v", name, e.vas)
	}
	if !e.nodes["t-node-0000"]["kubernetes.io/csi/d.example.com^t-vol-00000"] {
		t.Errorf("node t-node-0000 does not expect t-vol-00000: %v", e.nodes)
	}
	if !e.nodes["t-node-0001"]["kubernetes.io/csi/d.example.com^t-vol-00003"] {
		t.Errorf("node t-node-0001 does not expect t-vol-00003: %v", e.nodes)
	}
	w.Move(w.ChurnSet(0), 1)
	e = w.Expect(w.All())
	if !e.nodes["t-node-0001"]["kubernetes.io/csi/d.example.com^t-vol-00000"] ||
		!e.nodes["t-node-0000"]["kubernetes.io/csi/d.example.com^t-vol-00002"] {
		t.Errorf("after one churn round: %v", e.nodes)
	}
}

func TestTeardownExpectsTheNewPodsVolume(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const driver = "d.example.com"
	w := NewWorkload("t", driver, 2, 1)
	if e := w.TeardownExpect(); e.Volumes() != 1 || len(e.nodes) != 3 {
		t.Fatalf("teardown expects %d volumes on %d nodes, want 1 on 3 (2 and the canary)", e.Volumes(), len(e.nodes))
	}
	only := func(names map[string]bool) string {
		if len(names) != 1 {
			t.Fatalf("want one VolumeAttachment name, got %v", names)
		}
		for n := range names {
			return n
		}
		return ""
	}
	newVA := only(w.NewVolumeExpect(TeardownVolume, true).vas)
	if objs := w.NewVolumeObjects(TeardownVolume); len(objs) != 2 || !objs[newVA] || !objs[w.CanaryNode()] {
		t.Errorf("the teardown volume's objects = %v, want its VolumeAttachment %s and the canary node", objs, newVA)
	}
	if w.NewVolumeObjects(RestartVolume)[newVA] {
		t.Errorf("the restart's volume claims the teardown's VolumeAttachment %s", newVA)
	}
	left := only(w.Expect([]int{1}).vas)
	listed := func(handles ...string) []v1.AttachedVolume {
		var l []v1.AttachedVolume
		for _, h := range handles {
			l = append(l, v1.AttachedVolume{Name: v1.UniqueVolumeName(csiPlugin + driver + "^" + h)})
		}
		return l
	}
	node := func(name string, handles ...string) *v1.Node {
		n := framework.Node(name)
		n.Status.VolumesAttached = listed(handles...)
		return n
	}
	va := func(name, node string) *storagev1.VolumeAttachment {
		return &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node},
			Status:     storagev1.VolumeAttachmentStatus{Attached: true},
		}
	}
	// Each state is read by an observer of its own: a fake clientset's
	// watch may miss a change made right after the informers synced.
	observe := func(objs ...runtime.Object) *Observer {
		o, err := StartObserver(ctx, fake.NewClientset(objs...), 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(o.Stop)
		return o
	}
	// Mid-teardown: volume 1 still attached and listed on its node, the
	// new pod's volume attached and listed on the canary node.
	o := observe(
		node(w.NodeName(0)), node(w.NodeName(1), w.handle(1)), node(w.CanaryNode(), w.newHandle(TeardownVolume)),
		va(left, w.NodeName(1)), va(newVA, w.CanaryNode()),
	)
	if s := o.Snapshot(w.NewVolumeExpect(TeardownVolume, true)); !s.Converged() {
		t.Errorf("the new pod's volume, attached and listed, is not done: %s", s)
	}
	if s := o.Snapshot(w.TeardownExpect()); milestoneGone.Done(s) || milestoneStatus.Done(s) || s.Extra != 1 || s.Exact != 2 {
		t.Errorf("mid-teardown: %s; want 1 VolumeAttachment not expected left and 2/3 nodes exact", s)
	}
	// Done: only the new pod's volume is left, attached and listed.
	o = observe(
		node(w.NodeName(0)), node(w.NodeName(1)), node(w.CanaryNode(), w.newHandle(TeardownVolume)),
		va(newVA, w.CanaryNode()),
	)
	if s := o.Snapshot(w.TeardownExpect()); !milestoneGone.Done(s) || !milestoneStatus.Done(s) {
		t.Errorf("teardown not done with only the new pod's volume left: %s", s)
	}
}
