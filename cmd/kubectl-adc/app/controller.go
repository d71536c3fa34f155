package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	streamhttp "k8s.io/streaming/pkg/httpstream"
)

// explanation is one answer of the controller's /explain, as
// pkg/controller.Explanation encodes it.
type explanation struct {
	Volume    string   `json:"volume"`
	PodVolume string   `json:"podVolume,omitempty"`
	Node      string   `json:"node"`
	Action    string   `json:"action"`
	Reason    string   `json:"reason"`
	Desired   bool     `json:"desired"`
	Pods      []string `json:"pods,omitempty"`
	State     string   `json:"state,omitempty"`
	Reported  bool     `json:"reportedInNodeStatus"`
	Error     string   `json:"lastError,omitempty"`
	Mechanism *struct {
		Kind         string `json:"kind"`
		CSIDriver    string `json:"csiDriver,omitempty"`
		InTreePlugin string `json:"inTreePlugin,omitempty"`
		DecidedBy    string `json:"decidedBy"`
	} `json:"mechanism,omitempty"`
	Shadow            json.RawMessage `json:"shadow,omitempty"`
	AnotherController string          `json:"anotherController,omitempty"`
}

// controller asks a reachable controller's /explain.
type controller struct {
	base   *url.URL
	client *http.Client
	// via says how it was reached, for the reader.
	via   string
	close func()
}

// errNotReached wraps every reason the controller could not be asked.
var errNotReached = errors.New("the controller could not be reached")

// reach opens the way to the controller: --endpoint, else a port-forward
// to the pod holding the Lease.
func (o *Options) reach(ctx context.Context, c *clients) (*controller, error) {
	if o.Endpoint != "" {
		return o.reachEndpoint()
	}
	return o.reachLeader(ctx, c)
}

// userConfig is the user's credentials (token, client certificate, exec
// plugin) for host, which presents the certificate verified by ca, or none
// verified.
func userConfig(config *rest.Config, host, caFile string, insecure bool) *rest.Config {
	cfg := rest.CopyConfig(config)
	cfg.Host = host
	cfg.APIPath = ""
	cfg.TLSClientConfig.ServerName = ""
	cfg.TLSClientConfig.CAData = nil
	cfg.TLSClientConfig.CAFile = caFile
	cfg.TLSClientConfig.Insecure = insecure
	cfg.Timeout = 0
	return cfg
}

func (o *Options) reachEndpoint() (*controller, error) {
	u, err := url.Parse(o.Endpoint)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("--endpoint %q: want https://host:port", o.Endpoint)
	}
	if o.EndpointCA == "" && !o.InsecureEndpoint {
		return nil, errors.New("--endpoint needs --endpoint-ca, or --endpoint-insecure-skip-tls-verify for the controller's self-signed certificate")
	}
	c, err := o.clients()
	if err != nil {
		return nil, err
	}
	client, err := rest.HTTPClientFor(userConfig(c.config, u.Scheme+"://"+u.Host, o.EndpointCA, o.EndpointCA == ""))
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", o.Endpoint, err)
	}
	return &controller{base: u, client: client, via: o.Endpoint, close: func() {}}, nil
}

// leader finds the pod holding the controller's Lease: its holder identity
// is <pod name>_<random>.
func (o *Options) leader(ctx context.Context, c *clients) (string, error) {
	lease, err := c.client.CoordinationV1().Leases(o.ControllerNamespace).Get(ctx, o.LeaseName, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("no Lease %s/%s: the controller never led (not installed, or another --lease / --controller-namespace)", o.ControllerNamespace, o.LeaseName)
		}
		return "", fmt.Errorf("read Lease %s/%s: %w", o.ControllerNamespace, o.LeaseName, err)
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	if holder == "" {
		return "", fmt.Errorf("the Lease %s/%s has no holder: no replica leads", o.ControllerNamespace, o.LeaseName)
	}
	if lease.Spec.RenewTime != nil && lease.Spec.LeaseDurationSeconds != nil {
		expiry := lease.Spec.RenewTime.Add(time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second)
		if time.Now().After(expiry) {
			return "", fmt.Errorf("the Lease %s/%s held by %s expired %s ago: no replica leads", o.ControllerNamespace, o.LeaseName, holder, time.Since(expiry).Round(time.Second))
		}
	}
	pod, _, _ := strings.Cut(holder, "_")
	return pod, nil
}

func (o *Options) reachLeader(ctx context.Context, c *clients) (*controller, error) {
	pod, err := o.leader(ctx, c)
	if err != nil {
		return nil, err
	}
	if _, err := c.client.CoreV1().Pods(o.ControllerNamespace).Get(ctx, pod, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("leader pod %s/%s: %w", o.ControllerNamespace, pod, err)
	}
	pfURL := c.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(o.ControllerNamespace).Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(c.config)
	if err != nil {
		return nil, fmt.Errorf("port-forward transport: %w", err)
	}
	// As kubectl port-forward: a websocket tunnel first, SPDY where the API
	// server (or a proxy on the way) can't upgrade to it.
	var dialer streamhttp.Dialer = spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, pfURL)
	tunnel, err := portforward.NewSPDYOverWebsocketDialerForStreaming(pfURL, c.config)
	if err != nil {
		return nil, fmt.Errorf("port-forward websocket dialer: %w", err)
	}
	dialer = portforward.NewFallbackDialerForStreaming(tunnel, dialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
	})
	stop, ready := make(chan struct{}), make(chan struct{})
	var pfErr strings.Builder
	pf, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", o.Port)}, stop, ready, io.Discard, &pfErr)
	if err != nil {
		return nil, fmt.Errorf("port-forward to %s/%s: %w", o.ControllerNamespace, pod, err)
	}
	done := make(chan error, 1)
	go func() { done <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		if detail := strings.TrimSpace(pfErr.String()); detail != "" {
			err = fmt.Errorf("%w (%s)", err, detail)
		}
		return nil, fmt.Errorf("port-forward to %s/%s (needs create on pods/portforward there): %w", o.ControllerNamespace, pod, err)
	case <-ctx.Done():
		close(stop)
		return nil, fmt.Errorf("port-forward to %s/%s: %w", o.ControllerNamespace, pod, ctx.Err())
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		close(stop)
		return nil, fmt.Errorf("port-forward to %s/%s: no local port: %w", o.ControllerNamespace, pod, err)
	}
	host := fmt.Sprintf("https://127.0.0.1:%d", ports[0].Local)
	// The tunnel is the API server's, authenticated by it: the controller's
	// self-signed certificate at its end adds nothing to check.
	client, err := rest.HTTPClientFor(userConfig(c.config, host, "", true))
	if err != nil {
		close(stop)
		return nil, fmt.Errorf("client for %s: %w", host, err)
	}
	base, _ := url.Parse(host)
	return &controller{
		base:   base,
		client: client,
		via:    fmt.Sprintf("the leader %s/%s, through a port-forward", o.ControllerNamespace, pod),
		close:  func() { close(stop); <-done },
	}, nil
}

// explain asks /explain with query.
func (c *controller) explain(ctx context.Context, query url.Values) ([]explanation, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/explain"
	u.RawQuery = query.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: GET /explain: %w", errNotReached, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("%w: read /explain: %w", errNotReached, err)
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusUnauthorized:
		return nil, fmt.Errorf("%w: 401: the controller could not authenticate your credentials (a token or a client certificate of the cluster's CA)", errNotReached)
	case http.StatusForbidden:
		return nil, fmt.Errorf("%w: 403: you may not get /explain: bind the ClusterRole attach-detach-controller:explain to yourself", errNotReached)
	default:
		return nil, fmt.Errorf("%w: /explain answered %s: %s", errNotReached, resp.Status, strings.TrimSpace(string(body)))
	}
	// ?pod= answers a list; ?volume=&node= one explanation.
	var list []explanation
	if err := json.Unmarshal(body, &list); err == nil {
		return list, nil
	}
	var one explanation
	if err := json.Unmarshal(body, &one); err != nil {
		return nil, fmt.Errorf("decode /explain: %w", err)
	}
	return []explanation{one}, nil
}
