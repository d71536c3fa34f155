package guard

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	metadatafake "k8s.io/client-go/metadata/fake"
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

func object(kind, apiVersion, name string, entries ...metav1.ManagedFieldsEntry) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{Kind: kind, APIVersion: apiVersion},
		ObjectMeta: metav1.ObjectMeta{Name: name, ManagedFields: entries},
	}
}

func va(name string, entries ...metav1.ManagedFieldsEntry) runtime.Object {
	return object("VolumeAttachment", "storage.k8s.io/v1", name, entries...)
}

func node(name string, entries ...metav1.ManagedFieldsEntry) runtime.Object {
	return object("Node", "v1", name, entries...)
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
		objects []runtime.Object
		want    map[string]float64 // resource -> objects
		events  int
	}{
		{"alone", []runtime.Object{
			va("a", entry("attach-detach-controller", "", spec, after), entry("csi-attacher", "status", attacherStatus, after)),
			node("n", entry("attach-detach-controller", "status", volumesAttached, after), entry("kubelet", "status", volumesInUse, after)),
		}, map[string]float64{"nodes": 0, "volumeattachments": 0}, 0},
		{"kube-controller-manager before this one led", []runtime.Object{
			va("a", entry("kube-controller-manager", "", spec, before)),
			node("n", entry("kube-controller-manager", "status", volumesAttached, before)),
		}, map[string]float64{"nodes": 0, "volumeattachments": 0}, 0},
		{"kube-controller-manager beside it", []runtime.Object{
			va("a", entry("kube-controller-manager", "", spec, after)),
			va("b", entry("attach-detach-controller", "", spec, after)),
			node("n", entry("kube-controller-manager", "status", volumesAttached, after)),
			node("m", entry("kube-controller-manager", "status", volumesInUse, after)),
		}, map[string]float64{"nodes": 1, "volumeattachments": 1}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := metav1.AddMetaToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			client := metadatafake.NewSimpleMetadataClient(scheme, tc.objects...)
			rec := record.NewFakeRecorder(10)
			reg := prometheus.NewRegistry()
			g, err := New(Config{Client: client, Self: []string{"attach-detach-controller"}, Since: since,
				Period: time.Minute, Recorder: rec, Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := g.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
			for resource, want := range tc.want {
				if got := testutil.ToFloat64(g.writers.WithLabelValues(resource)); got != want {
					t.Errorf("%s: %v objects, want %v", resource, got, want)
				}
			}
			if got := len(rec.Events); got != tc.events {
				t.Errorf("%d events, want %d", got, tc.events)
			}
			// A second check posts no new event for the same writer.
			if _, err := g.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := len(rec.Events); got != tc.events {
				t.Errorf("after a second check: %d events, want %d", got, tc.events)
			}
		})
	}
}
