package migration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// httpClient bounds every request, so that a hung endpoint fails the poll
// that made it instead of outliving its deadline.
var httpClient = &http.Client{Timeout: 5 * time.Second}

// controller is one in-process run of the controller.
type controller struct {
	t        *testing.T
	endpoint string // host:port of /metrics and /readyz
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// startController runs the controller until the test ends (or stop) and
// returns once it has rebuilt its state (/readyz answers 200). opts change
// the options before the start.
func startController(t *testing.T, opts ...func(*app.Options)) *controller {
	t.Helper()
	if crdErr != nil {
		t.Fatalf("install CSINodeInfo CRD: %v", crdErr)
	}
	port, err := framework.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	o := app.NewOptions()
	o.Kubeconfig = cluster.Kubeconfig
	o.LeaderElection.LeaderElect = false
	o.HTTPEndpoint = "127.0.0.1:" + strconv.Itoa(port)
	for _, opt := range opts {
		opt(o)
	}

	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	c := &controller{t: t, endpoint: o.HTTPEndpoint, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- app.Run(ctx, o) }()
	t.Cleanup(c.stop)

	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		select {
		case err := <-c.done:
			return false, fmt.Errorf("controller exited during start-up: %w", err)
		default:
		}
		resp, err := httpClient.Get("http://" + c.endpoint + "/readyz")
		if err != nil {
			return false, nil // not listening yet
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}, "controller at %s to be ready", c.endpoint)
	return c
}

// stop cancels the controller and waits until app.Run has returned.
func (c *controller) stop() {
	c.stopOnce.Do(func() {
		c.cancel()
		select {
		case err := <-c.done:
			if err != nil && !errors.Is(err, context.Canceled) {
				c.t.Errorf("controller returned: %v", err)
			}
		case <-time.After(30 * time.Second):
			c.t.Errorf("controller did not stop within 30s of its context being cancelled")
		}
	})
}

// restart stops c and starts a new instance.
func (c *controller) restart(t *testing.T) *controller {
	t.Helper()
	c.stop()
	return startController(t)
}

// metric returns the sum of the samples of name whose labels include
// labels, from the controller's /metrics.
func (c *controller) metric(name string, labels map[string]string) (float64, error) {
	m, err := framework.ScrapeMetrics(c.t.Context(), "http://"+c.endpoint+"/metrics")
	if err != nil {
		return 0, err
	}
	return m.Sum(name, labels), nil
}

// mustMetric is metric for the test goroutine; a missing metric is 0.
func (c *controller) mustMetric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	v, err := c.metric(name, labels)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
