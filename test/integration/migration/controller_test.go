package migration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
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
// returns once it has rebuilt its state (/readyz answers 200).
func startController(t *testing.T) *controller {
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
	}, fmt.Sprintf("controller at %s to be ready", c.endpoint))
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
// labels, from the controller's /metrics, and whether any sample matched.
func (c *controller) metric(name string, labels map[string]string) (float64, bool, error) {
	resp, err := httpClient.Get("http://" + c.endpoint + "/metrics")
	if err != nil {
		return 0, false, fmt.Errorf("get /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false, fmt.Errorf("get /metrics: status %s", resp.Status)
	}
	var sum float64
	found := false
	s := bufio.NewScanner(resp.Body)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n, l, v, err := parseSample(line)
		if err != nil {
			return 0, false, err
		}
		if n != name || !includes(l, labels) {
			continue
		}
		sum += v
		found = true
	}
	if err := s.Err(); err != nil {
		return 0, false, fmt.Errorf("read /metrics: %w", err)
	}
	return sum, found, nil
}

// mustMetric is metric for the test goroutine; a missing metric is 0.
func (c *controller) mustMetric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	v, _, err := c.metric(name, labels)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// parseSample reads one sample line of the Prometheus text format:
// name{k="v",...} value [timestamp].
func parseSample(line string) (string, map[string]string, float64, error) {
	labels := map[string]string{}
	name, rest := line, ""
	if i := strings.IndexAny(line, "{ "); i >= 0 {
		name, rest = line[:i], line[i:]
	}
	if strings.HasPrefix(rest, "{") {
		rest = rest[1:]
		for {
			rest = strings.TrimLeft(rest, ", ")
			if strings.HasPrefix(rest, "}") {
				rest = rest[1:]
				break
			}
			eq := strings.Index(rest, "=\"")
			if eq < 0 {
				return "", nil, 0, fmt.Errorf("malformed labels in %q", line)
			}
			key := rest[:eq]
			rest = rest[eq+2:]
			var val strings.Builder
			closed := false
			for i := 0; i < len(rest); i++ {
				switch ch := rest[i]; {
				case ch == '\\' && i+1 < len(rest):
					i++
					switch rest[i] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[i])
					}
				case ch == '"':
					rest, closed = rest[i+1:], true
				default:
					val.WriteByte(ch)
				}
				if closed {
					break
				}
			}
			if !closed {
				return "", nil, 0, fmt.Errorf("unterminated label value in %q", line)
			}
			labels[key] = val.String()
		}
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", nil, 0, fmt.Errorf("no value in %q", line)
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", nil, 0, fmt.Errorf("value of %q: %w", line, err)
	}
	return name, labels, v, nil
}

func includes(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func TestParseSample(t *testing.T) {
	tests := []struct {
		line   string
		name   string
		labels map[string]string
		value  float64
	}{
		{line: `up 1`, name: "up", labels: map[string]string{}, value: 1},
		{line: `a_total{plugin_name="kubernetes.io/aws-ebs",mechanism="csi"} 3`, name: "a_total",
			labels: map[string]string{"plugin_name": "kubernetes.io/aws-ebs", "mechanism": "csi"}, value: 3},
		{line: `b{x="q\"uo,te}"} 2.5e-3`, name: "b", labels: map[string]string{"x": `q"uo,te}`}, value: 0.0025},
	}
	for _, tc := range tests {
		name, labels, value, err := parseSample(tc.line)
		if err != nil {
			t.Errorf("parseSample(%q): %v", tc.line, err)
			continue
		}
		if name != tc.name || value != tc.value || len(labels) != len(tc.labels) || !includes(labels, tc.labels) {
			t.Errorf("parseSample(%q) = %q %v %v, want %q %v %v", tc.line, name, labels, value, tc.name, tc.labels, tc.value)
		}
	}
	if _, _, _, err := parseSample(`c{x="open} 1`); err == nil {
		t.Errorf("parseSample of an unterminated label value: no error")
	}
}
