package controller

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
)

// /explain says which mechanism attaches each volume of a pod and which
// object or rule chose it.
func TestExplainMechanism(t *testing.T) {
	const migratedAnnotation = "storage.alpha.kubernetes.io/migrated-plugins"
	ebs := func(id string) v1.Volume {
		return v1.Volume{Name: id, VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: id}}}
	}
	iscsi := v1.Volume{Name: "iscsi", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.x"}}}
	migrated := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "migrated", Annotations: map[string]string{migratedAnnotation: "kubernetes.io/aws-ebs"}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: "ebs.csi.aws.com", NodeID: "i-1"}}}}

	tests := []struct {
		name      string
		node      string
		csiNodes  []*storagev1.CSINode
		completed []string
		volumes   []v1.Volume
		want      map[string]Mechanism // by unique volume name
	}{
		{name: "migrated on the node", node: "migrated", csiNodes: []*storagev1.CSINode{migrated}, volumes: []v1.Volume{ebs("vol-1"), iscsi},
			want: map[string]Mechanism{
				"kubernetes.io/csi/ebs.csi.aws.com^vol-1": {Kind: "csi", CSIDriver: "ebs.csi.aws.com", InTreePlugin: "kubernetes.io/aws-ebs",
					DecidedBy: "CSINode migrated (annotation storage.alpha.kubernetes.io/migrated-plugins, spec.drivers)"},
				"kubernetes.io/iscsi/10.0.0.1:3260:iqn.x:0": {Kind: "in-tree", InTreePlugin: "kubernetes.io/iscsi",
					DecidedBy: "never migrated: the plugin has no CSI driver"},
			}},
		{name: "completed-migration policy", node: "bare", completed: []string{"kubernetes.io/aws-ebs"}, volumes: []v1.Volume{ebs("vol-2")},
			want: map[string]Mechanism{
				"kubernetes.io/csi/ebs.csi.aws.com^vol-2": {Kind: "csi", CSIDriver: "ebs.csi.aws.com", InTreePlugin: "kubernetes.io/aws-ebs",
					DecidedBy: "completed-migration policy: migrated on every node"},
			}},
		{name: "csi volume", node: "bare", volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "claim"}}}},
			want: map[string]Mechanism{
				"kubernetes.io/csi/d.example.com^h1": {Kind: "csi", CSIDriver: "d.example.com", DecidedBy: "PersistentVolume pv-1 (a CSI volume)"},
			}},
		{name: "undecided", node: "bare", volumes: []v1.Volume{ebs("vol-3")},
			want: map[string]Mechanism{
				"kubernetes.io/aws-ebs/vol-3": {InTreePlugin: "kubernetes.io/aws-ebs",
					DecidedBy: "undecided: waiting for CSINode bare to decide whether in-tree plugin kubernetes.io/aws-ebs is migrated"},
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			client := fake.NewClientset()
			inf := NewInformers(client, nil, false, nil)
			c, err := New(Config{
				Client: client, Informers: inf, Recorder: record.NewFakeRecorder(100), Metrics: metrics.New(),
				Registerer: prometheus.NewRegistry(), CompletedMigrations: tc.completed,
				InTree: intree.Builtin(), Workers: 1, StatusWorkers: 1,
				RateLimiter: func() workqueue.TypedRateLimiter[cache.Key] {
					return workqueue.NewTypedItemExponentialFailureRateLimiter[cache.Key](time.Millisecond, time.Second)
				},
				NodeRateLimiter: func() workqueue.TypedRateLimiter[string] {
					return workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Millisecond, time.Second)
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.shutdownQueues()
			node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: tc.node, Annotations: map[string]string{managedAnnotation: "true"}}}
			pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod", Namespace: "ns", UID: "u1"},
				Spec: v1.PodSpec{NodeName: tc.node, Volumes: tc.volumes}}
			for _, add := range []func() error{
				func() error { return inf.Nodes.GetIndexer().Add(node) },
				func() error { return inf.Pods.GetIndexer().Add(pod) },
			} {
				if err := add(); err != nil {
					t.Fatal(err)
				}
			}
			pvc := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "ns", UID: "c1"},
				Spec: v1.PersistentVolumeClaimSpec{VolumeName: "pv-1"}, Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound}}
			pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1"}, Spec: v1.PersistentVolumeSpec{
				ClaimRef:               &v1.ObjectReference{Namespace: "ns", Name: "claim", UID: "c1"},
				PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}}}
			if err := inf.PVCs.GetIndexer().Add(pvc); err != nil {
				t.Fatal(err)
			}
			if err := inf.PVs.GetIndexer().Add(pv); err != nil {
				t.Fatal(err)
			}
			for _, n := range tc.csiNodes {
				if err := inf.CSINodes.GetIndexer().Add(n); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.syncPod(ctx, "ns/pod"); err != nil {
				t.Fatal(err)
			}
			if err := c.syncNode(ctx, tc.node); err != nil {
				t.Fatal(err)
			}
			got := map[string]Mechanism{}
			for _, e := range c.ExplainPod(ctx, "ns/pod") {
				if e.Mechanism == nil {
					t.Errorf("%s: no mechanism explained", e.Volume)
					continue
				}
				got[e.Volume] = *e.Mechanism
			}
			if len(got) != len(tc.want) {
				t.Errorf("explained %v, want %v", got, tc.want)
			}
			for v, want := range tc.want {
				if got[v] != want {
					t.Errorf("%s: mechanism %+v, want %+v", v, got[v], want)
				}
			}
		})
	}
}

// /explain?pod= never answers with nothing: a pod that wants no volume
// attached, or a volume of it that is not, is told why.
func TestExplainPodSaysWhyNothingIsWanted(t *testing.T) {
	noAttach := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "noattach.example.com"},
		Spec: storagev1.CSIDriverSpec{AttachRequired: new(bool)}}
	pvC := csiPV("c", "h-c")
	pvC.Spec.CSI.Driver = noAttach.Name
	mixed := withPod(pod("mixed", "n1", "a", "b", "gone", "c"), inlineVolume(v1.Volume{Name: "scratch",
		VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}))
	objs := []runtime.Object{node("n1"), node("n2", unmanaged), claim("a"), csiPV("a", "h-a"), unboundClaim("b"),
		claim("c"), pvC, noAttach, mixed, pod("unscheduled", "", "a"), withPod(pod("done", "n1", "a"), phase(v1.PodSucceeded)),
		pod("away", "n2", "a"), pod("ghost", "n9", "a"),
		withPod(pod("scratch-only", "n1"), inlineVolume(v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}))}
	f := newFixture(t, objs...)
	for _, p := range []string{"mixed", "unscheduled", "done", "away", "ghost", "scratch-only"} {
		if err := f.c.syncPod(f.ctx, ns+"/"+p); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"n1", "n2"} {
		if err := f.c.syncNode(f.ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	// A pod created since, not read yet.
	f.load(append(objs, pod("unread", "n1", "a"))...)
	// One line an answer: pod volume, volume, action, then the reason.
	explain := func(p string) []string {
		var out []string
		for _, e := range f.c.ExplainPod(f.ctx, ns+"/"+p) {
			out = append(out, e.PodVolume+" "+e.Volume+" "+e.Action+" "+e.Reason)
		}
		return out
	}
	tests := []struct {
		pod  string
		want []string // each answer's line starts with one, in order
	}{
		{"missing", []string{"  nothing no pod default/missing in the controller's cache"}},
		{"unscheduled", []string{"  nothing not scheduled to a node yet"}},
		{"done", []string{"  nothing terminated"}},
		{"away", []string{"  nothing node n2 is not managed by an attach/detach controller"}},
		{"ghost", []string{"  nothing node n9 is not in the controller's cache"}},
		{"scratch-only", []string{"  nothing none of its volumes is attached to a node"}},
		{"unread", []string{"a " + csiName("h-a") + " nothing resolves to this volume; the pod's last change is not read yet"}},
		{"mixed", []string{
			" " + csiName("h-a") + " attach ",
			"b  wait claim b is not bound",
			"gone  nothing can't be resolved (see the pod's FailedAttachVolume events): PersistentVolumeClaim \"default/gone\" not found",
			"c  nothing nothing to attach",
		}},
	}
	for _, tc := range tests {
		got := explain(tc.pod)
		ok := len(got) == len(tc.want)
		for i := 0; ok && i < len(got); i++ {
			ok = strings.HasPrefix(got[i], tc.want[i])
		}
		if !ok {
			t.Errorf("/explain?pod=%s/%s:\n got %q\nwant %q...", ns, tc.pod, got, tc.want)
		}
	}

	// While the pods are read after a start, a pod not read yet says so.
	f.c.desired.SetPartial(true)
	if got, want := explain("unread"), "  nothing reading every pod after the controller started"; len(got) != 1 || !strings.HasPrefix(got[0], want) {
		t.Errorf("while pods are read: got %q, want %q...", got, want)
	}
}

// Every /explain answer says that another attach/detach controller acts
// beside this one, when the guard says so, and nothing when it does not.
func TestExplainSaysAnotherControllerActs(t *testing.T) {
	var another string
	f := newFixtureWith(t, func(c *Config) { c.AnotherController = func() string { return another } },
		node("n1"), claim("a"), csiPV("a", "h-a"), pod("p", "n1", "a"))
	if err := f.c.syncPod(f.ctx, ns+"/p"); err != nil {
		t.Fatal(err)
	}
	get := func(query string) string {
		rec := httptest.NewRecorder()
		f.c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/explain?"+query, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("/explain?%s: %d %s", query, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	queries := []string{"pod=" + ns + "/p", "pod=" + ns + "/missing",
		url.Values{"volume": {string(csiName("h-a"))}, "node": {"n1"}}.Encode()}
	for _, q := range queries {
		if body := get(q); strings.Contains(body, "anotherController") {
			t.Errorf("/explain?%s with no other controller: %s", q, body)
		}
	}
	another = "another attach/detach controller acts beside this one: field manager \"kube-controller-manager\""
	for _, q := range queries {
		var answers []Explanation
		body := get(q)
		if !strings.HasPrefix(body, "[") {
			body = "[" + body + "]"
		}
		if err := json.Unmarshal([]byte(body), &answers); err != nil || len(answers) == 0 {
			t.Fatalf("/explain?%s: %v: %s", q, err, body)
		}
		for _, e := range answers {
			if e.AnotherController != another {
				t.Errorf("/explain?%s: anotherController %q, want %q", q, e.AnotherController, another)
			}
		}
	}
}
