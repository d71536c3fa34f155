package app

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
)

// countingLimiter is the controller's budget, counting who draws on it.
type countingLimiter struct {
	*budget.Limiter
	waits atomic.Int32
}

func (c *countingLimiter) Wait(ctx context.Context) error {
	c.waits.Add(1)
	return c.Limiter.Wait(ctx)
}

// Events have a client, and so a budget, of their own (newBroadcaster):
// posting them must not take tokens from attaches and moves. run hands
// newController the controller's config, which carries the controller's
// budget as its RateLimiter; a client made from a copy of it shares that
// very limiter (rest.CopyConfig copies the pointer), so the events' client
// must not inherit it.
func TestEventsDoNotDrawOnTheControllerBudget(t *testing.T) {
	posted := make(chan string, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && strings.Contains(r.URL.Path, "/events") {
			posted <- string(body)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	defer srv.Close()

	o := NewOptions()
	config := &rest.Config{Host: srv.URL, QPS: o.QPS, Burst: o.Burst}
	// As run builds it.
	controllerConfig := rest.CopyConfig(config)
	limiter := &countingLimiter{Limiter: budget.New(o.QPS, o.Burst)}
	controllerConfig.RateLimiter = limiter

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run, err := newController(ctx, o, controllerConfig, fake.NewClientset(), prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer run.broadcaster.Shutdown()
	rec := run.broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "attachdetach-controller"})
	rec.Event(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}}, v1.EventTypeNormal, "SuccessfulAttachVolume", "x")
	select {
	case <-posted:
	case <-time.After(10 * time.Second):
		t.Fatal("the event was never posted")
	}
	if n := limiter.waits.Load(); n != 0 {
		t.Errorf("posting an event drew %d token(s) from the controller's API budget; events must have a budget of their own", n)
	}
}
