package migration

import (
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// controller is one in-process run of the controller.
type controller struct {
	*framework.Controller
	t *testing.T
}

// startController runs the controller until the test ends (or restart)
// and returns once it has rebuilt its state (/readyz answers 200). opts
// change the options before the start.
func startController(t *testing.T, opts ...func(*app.Options)) *controller {
	t.Helper()
	if crdErr != nil {
		t.Fatalf("install CSINodeInfo CRD: %v", crdErr)
	}
	c := framework.StartControllerT(t, framework.ControllerOptions{
		Kubeconfig: cluster.Kubeconfig,
		HTTP:       true,
		Configure: func(o *app.Options) {
			o.LeaderElection.LeaderElect = false
			for _, opt := range opts {
				opt(o)
			}
		},
	})
	if err := c.WaitReady(t.Context(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return &controller{Controller: c, t: t}
}

// restart stops c and starts a new instance.
func (c *controller) restart(t *testing.T) *controller {
	t.Helper()
	if err := c.Stop(30 * time.Second); err != nil {
		t.Error(err)
	}
	return startController(t)
}

// metric returns the sum of the samples of name whose labels include
// labels, from the controller's /metrics.
func (c *controller) metric(name string, labels map[string]string) (float64, error) {
	m, err := framework.ScrapeMetrics(c.t.Context(), c.HTTPURL+"/metrics")
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
