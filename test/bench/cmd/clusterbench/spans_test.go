package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
)

// at is t0 plus ms milliseconds.
var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func pod(name string, uid types.UID, node string, phase v1.PodPhase, deleting bool) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: uid},
		Spec:       v1.PodSpec{NodeName: node},
		Status:     v1.PodStatus{Phase: phase},
	}
	if deleting {
		p.DeletionTimestamp = &metav1.Time{Time: t0}
	}
	return p
}

func claim(name, selected, volume string) *v1.PersistentVolumeClaim {
	c := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
	if selected != "" {
		c.Annotations = map[string]string{selectedNodeAnnotation: selected}
	}
	if volume != "" {
		c.Spec.VolumeName = volume
		c.Status.Phase = v1.ClaimBound
	}
	return c
}

func pv(name, claim string) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			ClaimRef:               &v1.ObjectReference{Namespace: "ns", Name: claim},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: name}},
		},
	}
}

func va(pvName, node string, attached, deleting bool) *storagev1.VolumeAttachment {
	a := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: pvName + "-" + node},
		Spec: storagev1.VolumeAttachmentSpec{
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
	if deleting {
		a.DeletionTimestamp = &metav1.Time{Time: t0}
	}
	return a
}

func node(name string, attached, inUse []string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, u := range attached {
		n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: v1.UniqueVolumeName(u)})
	}
	for _, u := range inUse {
		n.Status.VolumesInUse = append(n.Status.VolumesInUse, v1.UniqueVolumeName(u))
	}
	return n
}

const unique = "kubernetes.io/csi/d^pv-1"

// start records web-0's start: every milestone 100 ms after the one
// before, events seen twice where a watch would repeat them.
func start(tl *timeline) {
	claimName := stack.StatefulSetClaim("web", 0)
	tl.pod(pod("web-0", "a", "", v1.PodPending, false), false, at(0))
	tl.claim(claim(claimName, "n1", ""), at(100))
	tl.pv(pv("pv-1", claimName), at(200))
	tl.claim(claim(claimName, "n1", "pv-1"), at(300))
	tl.pod(pod("web-0", "a", "n1", v1.PodPending, false), false, at(400))
	tl.va(va("pv-1", "n1", false, false), false, at(500))
	tl.node(node("n1", nil, []string{unique}), at(550))
	tl.va(va("pv-1", "n1", true, false), false, at(600))
	tl.va(va("pv-1", "n1", true, false), false, at(650))
	tl.node(node("n1", []string{unique}, []string{unique}), at(700))
	tl.node(node("n1", []string{unique}, []string{unique}), at(750))
	tl.pod(pod("web-0", "a", "n1", v1.PodRunning, false), false, at(800))
}

func TestStartSpans(t *testing.T) {
	tl := newTimeline()
	start(tl)
	names, pods := tl.startTimes("ns", "web", 2)
	if len(pods) != 2 || names[0] != "web-0" || names[1] != "web-1" {
		t.Fatalf("startTimes: %v, %d pods, want web-0 and web-1", names, len(pods))
	}
	for _, s := range startSpans {
		d, ok := s.of(pods[0])
		if !ok || d != 100*time.Millisecond {
			t.Errorf("%s: %s (seen %t), want 100ms", s.what, d, ok)
		}
		if _, ok := s.of(pods[1]); ok {
			t.Errorf("%s of web-1, which never started: seen", s.what)
		}
	}
	if d, _ := podStartup.of(pods[0]); d != 800*time.Millisecond {
		t.Errorf("pod startup %s, want 800ms", d)
	}
	if d, _ := attachShare.of(pods[0]); d != 300*time.Millisecond {
		t.Errorf("attach share %s, want 300ms (pod on node at 400 to listed at 700)", d)
	}
}

// TestMoveSpans: web-0 evicted from n1 and re-created on n2.
func TestMoveSpans(t *testing.T) {
	tl := newTimeline()
	start(tl)
	tl.pod(pod("web-0", "a", "n1", v1.PodRunning, true), false, at(1000))
	tl.pod(pod("web-0", "a", "n1", v1.PodRunning, true), true, at(1500))
	tl.pod(pod("web-0", "b", "", v1.PodPending, false), false, at(1600))
	tl.pod(pod("web-0", "b", "n2", v1.PodPending, false), false, at(1700))
	tl.node(node("n1", []string{unique}, nil), at(2000))
	tl.node(node("n1", nil, nil), at(2100))
	tl.va(va("pv-1", "n1", true, true), false, at(2200))
	tl.va(va("pv-1", "n1", true, true), true, at(2300))
	tl.va(va("pv-1", "n2", false, false), false, at(2600))
	tl.va(va("pv-1", "n2", true, false), false, at(2700))
	tl.node(node("n2", []string{unique}, []string{unique}), at(2900))
	tl.pod(pod("web-0", "b", "n2", v1.PodRunning, false), false, at(3000))

	moves := tl.moveTimes("ns", "web", []types.UID{"a"})
	if len(moves) != 1 || moves[0].from != "n1" || moves[0].to != "n2" {
		t.Fatalf("moves %+v, want web-0 from n1 to n2", moves)
	}
	want := map[string]time.Duration{
		"eviction → old pod gone":                             500 * time.Millisecond,
		"old pod gone → unmounted (out of volumesInUse)":      500 * time.Millisecond,
		"unmounted → out of old node's volumesAttached":       100 * time.Millisecond,
		"unmounted → detach begun (VolumeAttachment deleted)": 200 * time.Millisecond,
		"detach begun → VolumeAttachment gone":                100 * time.Millisecond,
		"old pod gone → new pod on node":                      200 * time.Millisecond,
		// From the later of detached (2300) and on node (1700).
		"attachable (detached, new pod on node) → new VolumeAttachment created": 300 * time.Millisecond,
		"new VolumeAttachment created → attached":                               100 * time.Millisecond,
		"attached → listed in new node's volumesAttached":                       200 * time.Millisecond,
		"listed → Running": 100 * time.Millisecond,
	}
	for _, s := range moveSpans {
		d, ok := s.of(moves[0].times)
		if w, listed := want[s.what]; !listed || !ok || d != w {
			t.Errorf("%s: %s (seen %t), want %s", s.what, d, ok, w)
		}
	}
	if d, _ := moveTotal.of(moves[0].times); d != 2*time.Second {
		t.Errorf("move %s, want 2s", d)
	}
	// The first start's milestones stay the first pod's.
	_, pods := tl.startTimes("ns", "web", 1)
	if d, _ := podStartup.of(pods[0]); d != 800*time.Millisecond {
		t.Errorf("first pod's startup %s after the move, want 800ms", d)
	}
}

func TestStoppedTimes(t *testing.T) {
	tl := newTimeline()
	start(tl)
	tl.pod(pod("web-0", "a", "n1", v1.PodRunning, true), false, at(1000))
	tl.pod(pod("web-0", "a", "n1", v1.PodRunning, true), true, at(1200))
	tl.node(node("n1", []string{unique}, nil), at(1500))
	tl.va(va("pv-1", "n1", true, true), false, at(1600))
	tl.va(va("pv-1", "n1", true, true), true, at(1700))
	names, pods := tl.stoppedTimes("ns", "web", at(900))
	if len(pods) != 1 || names[0] != "web-0" {
		t.Fatalf("stoppedTimes %v, want web-0", names)
	}
	if d, ok := stopTotal.of(pods[0]); !ok || d != 700*time.Millisecond {
		t.Errorf("deleted to detached %s (seen %t), want 700ms", d, ok)
	}
	if _, pods := tl.stoppedTimes("ns", "web", at(1100)); len(pods) != 0 {
		t.Errorf("stoppedTimes since after the deletion: %d pods, want none", len(pods))
	}
}

func TestNodeDiff(t *testing.T) {
	tl := newTimeline()
	tl.node(node("n1", nil, []string{"u"}), at(0))
	tl.node(node("n1", []string{"u"}, []string{"u"}), at(100))
	tl.node(node("n1", []string{"u"}, nil), at(200))
	tl.node(node("n1", nil, nil), at(300))
	tl.node(node("n1", []string{"u"}, nil), at(400)) // back: first moments stay
	f := tl.nodes[nodeVolume{"n1", "u"}]
	if f.inUse != at(0) || f.listed != at(100) || f.unused != at(200) || f.unlisted != at(300) {
		t.Errorf("node volume facts %+v, want in use at 0, listed at 100, unused at 200, unlisted at 300", f)
	}
}

func TestPercentile(t *testing.T) {
	var d distribution
	for i := 1; i <= 200; i++ {
		d.sorted = append(d.sorted, time.Duration(i)*time.Second)
	}
	for p, want := range map[float64]time.Duration{50: 100 * time.Second, 90: 180 * time.Second, 99: 198 * time.Second, 100: 200 * time.Second, 0: time.Second} {
		if got := d.percentile(p); got != want {
			t.Errorf("p%g = %s, want %s", p, got, want)
		}
	}
	if got := (distribution{}).percentile(50); got != 0 {
		t.Errorf("p50 of nothing = %s, want 0", got)
	}
}

func TestParseLoadAvg(t *testing.T) {
	if v, err := parseLoadAvg("3.10 4.07 4.28 2/811 6271\n"); err != nil || v != 3.1 {
		t.Errorf("parseLoadAvg = %g, %v; want 3.1", v, err)
	}
	if _, err := parseLoadAvg(""); err == nil {
		t.Error("parseLoadAvg of nothing: no error")
	}
}

func TestReportRatios(t *testing.T) {
	run := func(kind stack.AttachDetach, running time.Duration) *result {
		tt := times{mCreated: t0, mListed: t0.Add(running / 2), mRunning: t0.Add(running)}
		ph := phase{started: t0, names: []string{"web-0"}, pods: []times{tt}, took: running}
		return &result{kind: kind, round: 1, scaleUp: ph, drain: ph, scaleDown: ph}
	}
	r := &report{opts: options{nodes: 2, zones: 1, replicas: 1, drainPods: 1, controllers: "both", rounds: 1},
		runs: []*result{run(stack.KubeControllerManager, 4*time.Second), run(stack.Ours, 2*time.Second)}}
	md := r.markdown("")
	for _, want := range []string{
		"| this controller | kube-controller-manager | ratio |",
		"| **last pod Running, from the scale** | | **2.00** | **4.00** | **0.50** |",
		"| **pod startup: created → Running** | all | 2.00 / 2.00 / 2.00 | 4.00 / 4.00 / 4.00 | 0.50 / 0.50 / 0.50 |",
		"| **last volume in volumesAttached, from the scale** | | **1.00** | **2.00** | **0.50** |",
		"(1 not seen)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3, 1, 2}, 2},
		{[]time.Duration{4, 1}, 2},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestEarlyBinds(t *testing.T) {
	pods := []times{
		{mOnNode: at(0), mBound: at(100)},
		{mBound: at(0), mOnNode: at(100)},
		{mOnNode: at(0)},
	}
	if got := earlyBinds(pods); got != 1 {
		t.Errorf("earlyBinds = %d, want 1", got)
	}
}

func TestKubeletSkips(t *testing.T) {
	dir := t.TempDir()
	log := `I1128 02:51:04.1 kubelet.go:2760] "SyncLoop ADD" node="node-2" source="api" pods=["bench/web-22"]
E1128 02:51:04.667158   26762 kubelet.go:2239] "Unable to attach or mount volumes for pod; skipping pod" err="unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC bench/data-web-22: PVC is not bound" node="node-2" pod="bench/web-22"
E1128 02:51:04.7 kubelet.go:2239] "Unable to attach or mount volumes for pod; skipping pod" err="unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC other/data-web-3: PVC is not bound" node="node-2" pod="other/web-3"
E1128 02:51:04.8 kubelet.go:2239] "Unable to attach or mount volumes for pod; skipping pod" err="unmounted volumes=[data], unattached volumes=[data]: timed out waiting for the condition" node="node-2" pod="bench/web-4"
`
	if err := os.WriteFile(filepath.Join(dir, "hollow-node-node-2.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := kubeletSkips(dir, "bench")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got["web-22"] {
		t.Errorf("kubeletSkips = %v, want web-22 alone", got)
	}
	p := phase{started: t0, names: []string{"web-21", "web-22"}, pods: []times{{mRunning: at(1000)}, {mRunning: at(20000)}}}
	if w := p.without(got); len(w.pods) != 1 || w.names[0] != "web-21" || w.took != time.Second {
		t.Errorf("phase without web-22: %v, took %s; want web-21, 1s", w.names, w.took)
	}
}
