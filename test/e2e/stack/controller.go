package stack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/pkg/shadow"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// Controller is a running attach-detach-controller binary.
type Controller struct {
	*framework.Controller
	// URL is its secure port, as a cluster's Prometheus and operators reach
	// it: /metrics, /healthz, /readyz, /explain over HTTPS.
	URL string
	// Token is a bearer token the secure port accepts for every path (the
	// cluster admin's, checked by TokenReview and SubjectAccessReview).
	Token string
	// CertFile is the self-signed serving certificate the controller wrote.
	CertFile string

	mu     sync.Mutex
	client *http.Client
}

// StartController starts the controller binary against the cluster, without
// leader election (one replica runs at a time here, and a lease left by a
// killed one would only delay the next), and returns once /readyz answers
// ok: its state is rebuilt. extraArgs are appended to the flags.
func (s *Stack) StartController(ctx context.Context, extraArgs ...string) (*Controller, error) {
	for attempt := 1; ; attempt++ {
		c, err := s.startController(ctx, extraArgs)
		if err == nil {
			return c, nil
		}
		if attempt == portAttempts || c == nil || !strings.Contains(c.Output(), "address already in use") {
			return nil, err
		}
		s.logger.Info("Controller lost a port race, retrying with another port", "attempt", attempt)
	}
}

func (s *Stack) startController(ctx context.Context, extraArgs []string) (*Controller, error) {
	port, err := framework.FreePort()
	if err != nil {
		return nil, err
	}
	certDir, err := os.MkdirTemp(s.Cluster.Dir, "controller-cert-")
	if err != nil {
		return nil, err
	}
	c := &Controller{
		URL:      "https://127.0.0.1:" + strconv.Itoa(port),
		Token:    s.Cluster.Config.BearerToken,
		CertFile: filepath.Join(certDir, "attach-detach-controller.crt"),
	}
	name, logPath := s.logName(ControllerBinary)
	c.Controller, err = framework.StartController(ctx, framework.ControllerOptions{
		Name:       name,
		Binary:     s.controllerBin,
		LogPath:    logPath,
		Kubeconfig: s.Cluster.Kubeconfig,
		Args: append([]string{
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + certDir,
			"-v=2",
		}, extraArgs...),
		Ready: func(ctx context.Context) bool {
			_, code, err := c.get(ctx, "/readyz")
			return err == nil && code == http.StatusOK
		},
	})
	if err != nil {
		return nil, err
	}
	s.track(c.Process)
	if err := c.WaitReady(ctx, startTimeout); err != nil {
		return c, err
	}
	s.logger.V(1).Info("Controller ready", "url", c.URL, "pid", c.Process.Pid(), "log", c.Process.LogPath)
	return c, nil
}

// get fetches path from the controller's HTTP endpoint.
func (c *Controller) get(ctx context.Context, path string) ([]byte, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client, err := c.httpClient()
	if err != nil {
		return nil, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL+path, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("request %s: %w", path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := client.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("get %s%s: %w", c.URL, path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read fully below; nothing to lose
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("read %s%s: %w", c.URL, path, err)
	}
	return body, resp.StatusCode, nil
}

// httpClient trusts the controller's self-signed certificate, read once it
// is written.
func (c *Controller) httpClient() (*http.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil {
		return c.client, nil
	}
	pem, err := os.ReadFile(c.CertFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate of the controller: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("serving certificate %s: no certificate in it", c.CertFile)
	}
	c.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	return c.client, nil
}

// Metrics scrapes /metrics.
func (c *Controller) Metrics(ctx context.Context) (framework.Metrics, error) {
	body, code, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("scrape %s/metrics: status %d: %s", c.URL, code, body)
	}
	return framework.ParseMetrics(string(body))
}

// Explanation is one volume of an /explain answer, as the controller
// serves it.
type Explanation = controller.Explanation

// Explain asks /explain about every volume of the pod namespace/name. raw is
// the JSON as served.
func (c *Controller) Explain(ctx context.Context, pod string) (explanations []Explanation, raw string, err error) {
	body, code, err := c.get(ctx, "/explain?pod="+pod)
	if err != nil {
		return nil, "", err
	}
	if code != http.StatusOK {
		return nil, string(body), fmt.Errorf("get /explain?pod=%s: status %d: %s", pod, code, body)
	}
	if err := json.Unmarshal(body, &explanations); err != nil {
		return nil, string(body), fmt.Errorf("decode /explain?pod=%s: %w", pod, err)
	}
	return explanations, string(body), nil
}

// ShadowReport reads /shadow, the report of a controller in shadow mode. raw
// is the JSON as served.
func (c *Controller) ShadowReport(ctx context.Context) (report shadow.Summary, raw string, err error) {
	body, code, err := c.get(ctx, "/shadow")
	if err != nil {
		return report, "", err
	}
	if code != http.StatusOK {
		return report, string(body), fmt.Errorf("get /shadow: status %d: %s", code, body)
	}
	if err := json.Unmarshal(body, &report); err != nil {
		return report, string(body), fmt.Errorf("decode /shadow: %w", err)
	}
	return report, string(body), nil
}
