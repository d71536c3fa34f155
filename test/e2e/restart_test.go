package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// TestRestartDetachesNothing: a controller stopped with SIGTERM and started
// again keeps every attachment still in use (same VolumeAttachment objects,
// never marked for deletion, still in node status), and detaches the volume
// of a pod deleted while it was down.
func TestRestartDetachesNothing(t *testing.T) {
	e := newEnv(t, "restart", 2)
	var kept []csiVolume
	var keptNodes []string
	for i := range 4 {
		v := e.createVolume(fmt.Sprintf("kept-%d", i))
		node := e.nodes[i%len(e.nodes)]
		e.createPod(fmt.Sprintf("kept-%d", i), node, v.claim)
		kept, keptNodes = append(kept, v), append(keptNodes, node)
	}
	gone := e.createVolume("gone")
	e.createPod("gone", e.nodes[0], gone.claim)
	uids := map[string]types.UID{}
	for i, v := range kept {
		uids[v.vaName(keptNodes[i])] = e.waitAttached(v, keptNodes[i]).UID
	}
	e.waitAttached(gone, e.nodes[0])
	rec := e.recordVolumeAttachments()
	status := e.recordNodeStatus()

	if err := e.controller.Stop(stopTimeout); err != nil {
		t.Fatal(err)
	}
	e.deletePod("gone")
	e.waitPodGone("gone")
	e.startController()

	// The detach proves the new controller has decided on everything it
	// found: the kept volumes had their chance to be detached wrongly.
	e.waitDetached(gone, e.nodes[0])
	rec.check(t)
	status.check(t)
	// The recorders see a detach: that of the deleted pod's volume.
	if !rec.wasDeleted(gone.vaName(e.nodes[0])) || !status.wasRemoved(e.nodes[0], gone.name()) {
		t.Fatalf("the recorders missed the detach of %s from %s", gone.name(), e.nodes[0])
	}
	for i, v := range kept {
		if status.wasRemoved(keptNodes[i], v.name()) {
			t.Errorf("%s (in use) was removed from node %s volumesAttached across the restart", v.name(), keptNodes[i])
		}
		name := v.vaName(keptNodes[i])
		if rec.wasDeleted(name) {
			t.Errorf("VolumeAttachment %s of %s (in use on %s) was deleted across the restart", name, v.pv, keptNodes[i])
		}
		if got := rec.uidsOf(name); len(got) != 1 || got[0] != uids[name] {
			t.Errorf("VolumeAttachment %s of %s: UIDs %v across the restart, want only %s", name, v.pv, got, uids[name])
		}
		e.waitAttached(v, keptNodes[i])
	}
}

// TestKilledMidAttachConverges: a controller killed with SIGKILL while it
// attaches a batch of volumes, started again, attaches every one exactly
// once: one VolumeAttachment per volume, on its pod's node, and node status
// listing exactly the node's volumes, each once.
func TestKilledMidAttachConverges(t *testing.T) {
	e := newEnv(t, "sigkill", 3)
	const pods = 30
	want := map[string][]csiVolume{} // node -> volumes
	var all []csiVolume
	for i := range pods {
		v := e.createVolume(fmt.Sprintf("vol-%d", i))
		all = append(all, v)
	}
	rec := e.recordVolumeAttachments()
	status := e.recordNodeStatus()
	// Kill it at the first attachment csi-attacher completes: some
	// VolumeAttachments exist, few are attached, fewer in node status.
	w, err := e.client.StorageV1().VolumeAttachments().Watch(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range all {
		node := e.nodes[i%len(e.nodes)]
		e.createPod(fmt.Sprintf("pod-%d", i), node, v.claim)
		want[node] = append(want[node], v)
	}
	e.waitWatch(w, "a first attached VolumeAttachment", func(va *storagev1.VolumeAttachment) bool {
		return slices.Contains(e.nodes, va.Spec.NodeName) && va.Status.Attached
	})
	if err := e.controller.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	list, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	attached, reported := 0, 0
	for _, va := range e.ours(list.Items) {
		if va.Status.Attached {
			attached++
		}
	}
	for _, node := range e.nodes {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reported += len(n.Status.VolumesAttached)
	}
	t.Logf("controller killed with %d of %d VolumeAttachments created, %d attached, %d in node status",
		len(e.ours(list.Items)), pods, attached, reported)

	e.startController()
	for node, vols := range want {
		for _, v := range vols {
			e.waitAttached(v, node)
		}
	}

	rec.check(t)
	status.check(t)
	list, err = e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wantVAs, gotVAs []string
	for node, vols := range want {
		for _, v := range vols {
			wantVAs = append(wantVAs, v.vaName(node))
			if status.wasRemoved(node, v.name()) {
				t.Errorf("%s was removed from node %s volumesAttached: a detach started", v.name(), node)
			}
			if n := len(rec.uidsOf(v.vaName(node))); n != 1 || rec.wasDeleted(v.vaName(node)) {
				t.Errorf("VolumeAttachment %s of %s: created %d times, deleted %v; want created once, never deleted", v.vaName(node), v.pv, n, rec.wasDeleted(v.vaName(node)))
			}
		}
	}
	for _, va := range e.ours(list.Items) {
		gotVAs = append(gotVAs, va.Name)
	}
	slices.Sort(wantVAs)
	slices.Sort(gotVAs)
	if !slices.Equal(gotVAs, wantVAs) {
		t.Errorf("VolumeAttachments of the test's nodes:\n got %v\nwant %v", gotVAs, wantVAs)
	}
	for _, node := range e.nodes {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got, wantNames []string
		for _, a := range n.Status.VolumesAttached {
			got = append(got, string(a.Name))
		}
		for _, v := range want[node] {
			wantNames = append(wantNames, v.name())
		}
		slices.Sort(got)
		slices.Sort(wantNames)
		if !slices.Equal(got, wantNames) {
			t.Errorf("node %s volumesAttached (each must appear once):\n got %v\nwant %v", node, got, wantNames)
		}
		if inUse := volumeNames(n.Status.VolumesInUse); !slices.Equal(inUse, wantNames) {
			t.Errorf("node %s volumesInUse:\n got %v\nwant %v", node, inUse, wantNames)
		}
	}
}

// waitWatch reads w until an object satisfies cond, and stops it.
func (e *env) waitWatch(w watch.Interface, what string, cond func(*storagev1.VolumeAttachment) bool) {
	e.t.Helper()
	defer w.Stop()
	timeout := time.After(waitTimeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				e.t.Fatalf("wait for %s: watch closed", what)
			}
			if va, isVA := ev.Object.(*storagev1.VolumeAttachment); isVA && cond(va) {
				return
			}
		case <-timeout:
			e.t.Fatalf("wait for %s: not seen after %s", what, waitTimeout)
		}
	}
}

// ours keeps the VolumeAttachments of the test's nodes.
func (e *env) ours(vas []storagev1.VolumeAttachment) []storagev1.VolumeAttachment {
	var out []storagev1.VolumeAttachment
	for _, va := range vas {
		if slices.Contains(e.nodes, va.Spec.NodeName) {
			out = append(out, va)
		}
	}
	return out
}

func volumeNames(names []v1.UniqueVolumeName) []string {
	out := make([]string, 0, len(names))
	for _, n := range names {
		out = append(out, string(n))
	}
	slices.Sort(out)
	return out
}
