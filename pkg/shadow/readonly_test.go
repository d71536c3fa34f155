package shadow

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"
)

// TestReadOnlyRefusesWrites shows that a client wrapped by ReadOnly reads,
// and that its writes fail without reaching the server, counted.
func TestReadOnlyRefusesWrites(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	var writes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			writes.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}`))
	}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	guard, err := NewReadOnly(logger, reg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(guard.Wrap(&rest.Config{Host: srv.URL}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatalf("a read is refused: %v", err)
	}
	if err := client.StorageV1().VolumeAttachments().Delete(ctx, "csi-1", metav1.DeleteOptions{}); err == nil || !strings.Contains(err.Error(), "shadow mode writes nothing") {
		t.Errorf("delete: error %v, want a refusal", err)
	}
	if _, err := client.CoreV1().Nodes().PatchStatus(ctx, "n1", []byte(`{}`)); err == nil {
		t.Errorf("node status patch: no error, want a refusal")
	}
	if _, err := client.CoreV1().Events("ns").Create(ctx, &v1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e"}}, metav1.CreateOptions{}); err == nil {
		t.Errorf("event create: no error, want a refusal")
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("%d writes reached the server, want 0", n)
	}
	for verb, want := range map[string]float64{http.MethodDelete: 1, http.MethodPatch: 1, http.MethodPost: 1, http.MethodPut: 0} {
		if got := testutil.ToFloat64(guard.refused.WithLabelValues(verb)); got != want {
			t.Errorf("refused %s = %v, want %v", verb, got, want)
		}
	}
}
