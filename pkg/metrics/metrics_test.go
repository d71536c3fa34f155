package metrics

import (
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestOperationDurationAsUpstream checks storage_operation_duration_seconds
// against kube-controller-manager v1.37's definition
// (pkg/volume/util/metrics.go): the same help as component-base serves it,
// stability level included, the same labels and buckets, so that dashboards
// and alerts written for kube-controller-manager read ours unchanged.
func TestOperationDurationAsUpstream(t *testing.T) {
	m := New()
	reg := prometheus.NewPedanticRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	m.ObserveOperation("kubernetes.io/csi:d", OperationAttach, false, true, 2*time.Second)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == "storage_operation_duration_seconds" })
	if i < 0 {
		t.Fatal("storage_operation_duration_seconds not gathered")
	}
	mf := mfs[i]
	if got, want := mf.GetHelp(), "[BETA] Storage operation duration"; got != want {
		t.Errorf("help %q, want %q", got, want)
	}
	if mf.GetType() != dto.MetricType_HISTOGRAM {
		t.Errorf("type %v, want histogram", mf.GetType())
	}
	if len(mf.GetMetric()) != 1 {
		t.Fatalf("%d series, want 1", len(mf.GetMetric()))
	}
	s := mf.GetMetric()[0]
	var labels []string
	for _, l := range s.GetLabel() {
		labels = append(labels, l.GetName()+"="+l.GetValue())
	}
	wantLabels := []string{"migrated=false", "operation_name=volume_attach", "status=success", "volume_plugin=kubernetes.io/csi:d"}
	if !slices.Equal(labels, wantLabels) {
		t.Errorf("labels %v, want %v", labels, wantLabels)
	}
	var bounds []float64
	for _, b := range s.GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	wantBounds := []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600}
	if !slices.Equal(bounds, wantBounds) {
		t.Errorf("buckets %v, want %v", bounds, wantBounds)
	}
}
