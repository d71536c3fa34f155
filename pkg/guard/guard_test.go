package guard

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

var since = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func entry(manager, subresource, fields string, at time.Time) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{
		Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: subresource,
		Time: &metav1.Time{Time: at}, FieldsType: "FieldsV1",
		FieldsV1: metav1.NewFieldsV1(fields),
	}
}

func va(name string, entries ...metav1.ManagedFieldsEntry) any {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: entries}}
}

func node(name string, entries ...metav1.ManagedFieldsEntry) any {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: entries}}
}

const (
	spec            = `{"f:spec":{"f:attacher":{},"f:nodeName":{},"f:source":{}}}`
	volumesAttached = `{"f:status":{"f:volumesAttached":{}}}`
	volumesInUse    = `{"f:status":{"f:volumesInUse":{}}}`
	attacherStatus  = `{"f:status":{"f:attached":{}}}`
)

func TestCheck(t *testing.T) {
	after, before := since.Add(time.Minute), since.Add(-time.Hour)
	for _, tc := range []struct {
		name    string
		objects []any
		want    map[string]float64 // resource -> objects
		events  int
	}{
		{"alone", []any{
			va("a", entry("attach-detach-controller", "", spec, after), entry("csi-attacher", "status", attacherStatus, after)),
			node("n", entry("attach-detach-controller", "status", volumesAttached, after), entry("kubelet", "status", volumesInUse, after)),
		}, map[string]float64{"nodes": 0, "volumeattachments": 0}, 0},
		{"kube-controller-manager before this one led", []any{
			va("a", entry("kube-controller-manager", "", spec, before)),
			node("n", entry("kube-controller-manager", "status", volumesAttached, before)),
		}, map[string]float64{"nodes": 0, "volumeattachments": 0}, 0},
		{"kube-controller-manager beside it", []any{
			va("a", entry("kube-controller-manager", "", spec, after)),
			va("b", entry("attach-detach-controller", "", spec, after)),
			node("n", entry("kube-controller-manager", "status", volumesAttached, after)),
			node("m", entry("kube-controller-manager", "status", volumesInUse, after)),
		}, map[string]float64{"nodes": 1, "volumeattachments": 1}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record.NewFakeRecorder(10)
			reg := prometheus.NewRegistry()
			g, err := New(Config{Self: []string{"attach-detach-controller"}, Since: since,
				Period: time.Minute, Recorder: rec, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tc.objects {
				g.Observe(o)
			}
			g.Check(context.Background())
			for resource, want := range tc.want {
				if got := testutil.ToFloat64(g.writers.WithLabelValues(resource)); got != want {
					t.Errorf("%s: %v objects, want %v", resource, got, want)
				}
			}
			if got := len(rec.Events); got != tc.events {
				t.Errorf("%d events, want %d", got, tc.events)
			}
			// A second check posts no new event for the same writer.
			g.Check(context.Background())
			if got := len(rec.Events); got != tc.events {
				t.Errorf("after a second check: %d events, want %d", got, tc.events)
			}
		})
	}
}

// A write seen on an object deleted or taken over before a check (this
// controller deleting the other's VolumeAttachment at once) is still
// reported by the next check, once.
func TestFindingReportedOnceItsObjectWent(t *testing.T) {
	after := since.Add(time.Minute)
	g, err := New(Config{Self: []string{"attach-detach-controller"}, Since: since, Period: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	g.Observe(va("a", entry("kube-controller-manager", "", spec, after)))
	g.Forget(va("a"))
	g.Observe(node("n", entry("kube-controller-manager", "status", volumesAttached, after)))
	g.Observe(node("n", entry("attach-detach-controller", "status", volumesAttached, after.Add(time.Second)),
		entry("kube-controller-manager", "status", `{"f:status":{}}`, after)))
	found := g.Check(context.Background())
	if len(found) != 2 || found[0].Resource != "nodes" || found[1].Resource != "volumeattachments" ||
		found[0].Manager != "kube-controller-manager" || found[1].Manager != "kube-controller-manager" {
		t.Fatalf("first check after the objects went: %+v, want the node and the VolumeAttachment, by kube-controller-manager", found)
	}
	if found := g.Check(context.Background()); len(found) != 0 {
		t.Fatalf("second check: %+v, want none", found)
	}
	// Written again: found again.
	g.Observe(va("a", entry("kube-controller-manager", "", spec, after.Add(2*time.Second))))
	if found := g.Check(context.Background()); len(found) != 1 {
		t.Fatalf("after another write: %+v, want the VolumeAttachment", found)
	}
}

// A finding lasts as long as the object's latest version shows the other
// writer: once reported, it goes when this controller takes the field over,
// or when the object is deleted.
func TestFindingsFollowTheObjects(t *testing.T) {
	after := since.Add(time.Minute)
	g, err := New(Config{Self: []string{"attach-detach-controller"}, Since: since, Period: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int { return len(g.Check(context.Background())) }
	g.Observe(node("n", entry("kube-controller-manager", "status", volumesAttached, after)))
	g.Observe(va("a", entry("kube-controller-manager", "", spec, after)))
	g.Observe(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{
		entry("kube-controller-manager", "", spec, after)}}})
	if got := count(); got != 2 {
		t.Fatalf("%d findings, want 2 (a node and a VolumeAttachment)", got)
	}
	// This controller rewrote the node's volumesAttached: the field is its own.
	g.Observe(node("n", entry("attach-detach-controller", "status", volumesAttached, after.Add(time.Second)),
		entry("kube-controller-manager", "status", `{"f:status":{}}`, after)))
	if got := count(); got != 1 {
		t.Fatalf("after the node's field was taken over: %d findings, want 1", got)
	}
	g.Forget(toolscache.DeletedFinalStateUnknown{Key: "a", Obj: va("a")})
	if got := count(); got != 0 {
		t.Fatalf("after the VolumeAttachment was deleted: %d findings, want 0", got)
	}
}
