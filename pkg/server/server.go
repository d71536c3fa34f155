// Package server serves the controller's endpoints (/metrics, /explain,
// /healthz, /readyz, /livez) over HTTPS, behind the API server's own
// authentication and authorization, as kube-controller-manager serves its
// secure port, with the same flags:
//
//   - a bearer token is checked with a TokenReview; a client certificate
//     against the client CA (--client-ca-file, else the cluster's, as
//     published in kube-system/extension-apiserver-authentication); a
//     front proxy's headers once its certificate is checked; answers are
//     cached for 10s;
//   - access is a SubjectAccessReview of the non-resource path: `get
//     /metrics`, `get /explain`; system:masters is allowed without one;
//   - the paths of --authorization-always-allow-paths (/healthz, /readyz,
//     /livez) are answered without either, so that kubelet's probes need no
//     token.
//
// Unlike kube-controller-manager, a request without credentials is refused
// with 401 on every other path rather than authorized as system:anonymous:
// nothing but the probes is readable without a token.
//
// The pieces are k8s.io/apiserver's small ones (its request
// authenticators, token cache, path authorizer and certificate
// reloaders); the reviews are plain client-go calls and the serving is
// net/http. Its generic server, options and webhook packages are not
// linked: they bring tracing, CEL and etcd clients that cost about 27 MiB
// of memory at start for nothing this endpoint does.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	netutils "k8s.io/utils/net"
)

// enabled says whether the secure endpoint is served (--secure-port 0
// turns it off).
func (o *Options) enabled() bool {
	return o.BindPort != 0 || o.Listener != nil
}

// Serve serves h behind the filter chain until ctx is cancelled, unless
// --secure-port is 0; stop cancels it and waits until it has stopped.
// kubeconfig, when not empty, is used for the reviews unless
// --authentication-kubeconfig / --authorization-kubeconfig say otherwise;
// empty means the in-cluster configuration, and none outside a cluster.
func (o *Options) Serve(ctx context.Context, kubeconfig string, h http.Handler) (stop func(), err error) {
	if !o.enabled() {
		return func() {}, nil
	}
	serveCtx, cancel := context.WithCancel(ctx)
	stopped, addr, err := o.serve(serveCtx, kubeconfig, h)
	if err != nil {
		cancel()
		return nil, err
	}
	klog.FromContext(ctx).Info("Serving securely", "address", addr)
	return func() {
		cancel()
		<-stopped
	}, nil
}

// shutdownTimeout is how long the requests under way may take once the
// server stops.
const shutdownTimeout = 5 * time.Second

// serve resolves the options, starts the certificate and configmap
// watchers and the server; the returned channel is closed once the server
// has stopped and its requests are done.
func (o *Options) serve(ctx context.Context, kubeconfig string, h http.Handler) (<-chan struct{}, string, error) {
	authnClient, err := reviewClient(ctx, o.AuthenticationKubeconfig, kubeconfig, "authentication")
	if err != nil {
		return nil, "", err
	}
	authzClient, err := reviewClient(ctx, o.AuthorizationKubeconfig, kubeconfig, "authorization")
	if err != nil {
		return nil, "", err
	}
	authn, err := o.newAuthentication(ctx, authnClient)
	if err != nil {
		return nil, "", fmt.Errorf("delegated authentication: %w", err)
	}
	authz, err := o.newAuthorizer(ctx, authzClient)
	if err != nil {
		return nil, "", fmt.Errorf("delegated authorization: %w", err)
	}
	tlsConfig, runners, err := o.tlsConfig(ctx, authn.clientCAs)
	if err != nil {
		return nil, "", err
	}
	ln := o.Listener
	if ln == nil {
		if ln, err = o.listen(ctx); err != nil {
			return nil, "", err
		}
	}
	for _, r := range append(authn.runners, runners...) {
		go r.Run(ctx, 1)
	}

	srv := &http.Server{
		Handler:           withFilters(h, authn.authenticator, authz, RequestTimeout),
		MaxHeaderBytes:    1 << 20,
		TLSConfig:         tlsConfig,
		IdleTimeout:       90 * time.Second,
		ReadHeaderTimeout: 32 * time.Second,
		ErrorLog:          log.New(handshakeErrors{logger: klog.FromContext(ctx)}, "", 0),
	}
	if o.DisableHTTP2 {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
	} else {
		// As the kube-apiserver's serving: frames and per-stream buffers of
		// 256 KiB, 100 streams unless told otherwise (net/http's HTTP/2,
		// negotiated by the listener's NextProtos).
		const frame = 256 * 1024
		streams := 100
		if o.HTTP2MaxStreamsPerConnection > 0 {
			streams = o.HTTP2MaxStreamsPerConnection
		}
		srv.HTTP2 = &http.HTTP2Config{
			MaxConcurrentStreams:          streams,
			MaxReadFrameSize:              frame,
			MaxReceiveBufferPerStream:     frame,
			MaxReceiveBufferPerConnection: frame * streams,
		}
	}
	addr := ln.Addr().String()
	stopped := make(chan struct{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer runtime.HandleCrash()
		plain := ln
		if tcp, ok := ln.(*net.TCPListener); ok {
			plain = keepAliveListener{tcp}
		}
		err := srv.Serve(tls.NewListener(plain, tlsConfig))
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Secure endpoint stopped", "address", addr)
		}
	}()
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			klog.FromContext(ctx).Error(err, "Failed to shut the secure endpoint down")
		}
		<-served
	}()
	return stopped, addr, nil
}

// reviewClient is the client of the reviews: flag, else kubeconfig, else
// the in-cluster configuration; nil outside a cluster with neither.
func reviewClient(ctx context.Context, flagFile, kubeconfig, what string) (kubernetes.Interface, error) {
	file := flagFile
	if file == "" {
		file = kubeconfig
	}
	var cfg *rest.Config
	var err error
	if file != "" {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: file},
			&clientcmd.ConfigOverrides{}).ClientConfig()
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, nil
		}
		if err != nil {
			klog.FromContext(ctx).Error(err, "Failed to read the in-cluster kubeconfig for delegated "+what)
			return nil, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("delegated %s kubeconfig: %w", what, err)
	}
	// High limits: they bound how fast the endpoint answers.
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = 200
	cfg.Burst = 400
	cfg.Timeout = 10 * time.Second
	return kubernetes.NewForConfig(rest.AddUserAgent(cfg, "attach-detach-controller"))
}

// tlsConfig is TLS 1.2 or newer unless told otherwise, HTTP/2, client
// certificates asked for (checked by the authenticators), the serving
// certificate and SNI certificates reloaded when their files change.
func (o *Options) tlsConfig(ctx context.Context, clientCAs []dynamiccertificates.CAContentProvider) (*tls.Config,
	[]dynamiccertificates.ControllerRunner, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	if o.DisableHTTP2 {
		cfg.NextProtos = []string{"http/1.1"}
	}
	if v, err := cliflag.TLSVersion(o.MinTLSVersion); err != nil {
		return nil, nil, fmt.Errorf("--tls-min-version: %w", err)
	} else if v > 0 {
		cfg.MinVersion = v
	}
	if len(o.CipherSuites) > 0 {
		suites, err := cliflag.TLSCipherSuites(o.CipherSuites)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-cipher-suites: %w", err)
		}
		cfg.CipherSuites = suites
		insecure := cliflag.InsecureTLSCiphers()
		for _, name := range o.CipherSuites {
			if _, ok := insecure[name]; ok {
				klog.FromContext(ctx).Info("Warning: use of insecure cipher detected", "cipher", name)
			}
		}
	}
	for _, c := range o.CurvePreferences {
		cfg.CurvePreferences = append(cfg.CurvePreferences, tls.CurveID(c))
	}

	var runners []dynamiccertificates.ControllerRunner
	var clientCA dynamiccertificates.CAContentProvider
	if len(clientCAs) > 0 {
		// Ask for a certificate, accept a connection without one: tokens
		// are checked after the handshake.
		cfg.ClientAuth = tls.RequestClientCert
		clientCA = dynamiccertificates.NewUnionCAContentProvider(clientCAs...)
	}
	serving, err := o.servingCert(ctx)
	if err != nil {
		return nil, nil, err
	}
	if r, ok := serving.(dynamiccertificates.ControllerRunner); ok {
		runners = append(runners, r)
	}
	var sni []dynamiccertificates.SNICertKeyContentProvider
	for _, nck := range o.SNICertKeys {
		c, err := dynamiccertificates.NewDynamicSNIContentFromFiles("sni-serving-cert", nck.CertFile, nck.KeyFile, nck.Names...)
		if err != nil {
			return nil, nil, fmt.Errorf("--tls-sni-cert-key %s: %w", nck.CertFile, err)
		}
		sni = append(sni, c)
		runners = append(runners, c)
	}
	ctrl := dynamiccertificates.NewDynamicServingCertificateController(cfg, clientCA, serving, sni, nil)
	if clientCA != nil {
		clientCA.AddListener(ctrl)
	}
	serving.AddListener(ctrl)
	for _, c := range sni {
		c.AddListener(ctrl)
	}
	// Files must be readable now; the configmaps were read already.
	for _, r := range runners {
		if err := r.RunOnce(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Initial population of a serving certificate failed")
		}
	}
	if err := ctrl.RunOnce(); err != nil {
		klog.FromContext(ctx).Error(err, "Initial population of dynamic certificates failed")
	}
	go ctrl.Run(1, ctx.Done())
	cfg.GetConfigForClient = ctrl.GetConfigForClient
	return cfg, runners, nil
}

// servingCert is --tls-cert-file and --tls-private-key-file, reloaded when
// they change; else the pair in --cert-dir, generated there when absent;
// else a self-signed certificate for localhost generated in memory.
func (o *Options) servingCert(ctx context.Context) (dynamiccertificates.CertKeyContentProvider, error) {
	certFile, keyFile := o.CertFile, o.KeyFile
	if certFile == "" && keyFile == "" && o.CertDirectory != "" {
		certFile = filepath.Join(o.CertDirectory, o.PairName+".crt")
		keyFile = filepath.Join(o.CertDirectory, o.PairName+".key")
		ok, err := certutil.CanReadCertAndKey(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("serving certificate in %s: %w", o.CertDirectory, err)
		}
		if !ok {
			cert, key, err := o.selfSigned()
			if err != nil {
				return nil, err
			}
			if err := certutil.WriteCert(certFile, cert); err != nil {
				return nil, fmt.Errorf("write %s: %w", certFile, err)
			}
			if err := keyutil.WriteKey(keyFile, key); err != nil {
				return nil, fmt.Errorf("write %s: %w", keyFile, err)
			}
			klog.FromContext(ctx).Info("Generated self-signed cert", "cert", certFile, "key", keyFile)
		}
	}
	if certFile != "" || keyFile != "" {
		c, err := dynamiccertificates.NewDynamicServingContentFromFiles("serving-cert", certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		return c, nil
	}
	cert, key, err := o.selfSigned()
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Generated self-signed cert in-memory")
	c, err := dynamiccertificates.NewStaticCertKeyContent("Generated self signed cert", cert, key)
	if err != nil {
		return nil, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	return c, nil
}

// selfSigned is a certificate for localhost and 127.0.0.1, and the bind
// address when it names one.
func (o *Options) selfSigned() (cert, key []byte, err error) {
	ips := []net.IP{netutils.ParseIPSloppy("127.0.0.1")}
	var dns []string
	if o.BindAddress == nil || o.BindAddress.IsUnspecified() {
		dns = append(dns, "localhost")
	} else {
		ips = append(ips, o.BindAddress)
	}
	cert, key, err = certutil.GenerateSelfSignedCertKey("localhost", ips, dns)
	if err != nil {
		return nil, nil, fmt.Errorf("unable to generate self signed cert: %w", err)
	}
	return cert, key, nil
}

// listen binds --bind-address:--secure-port, with SO_REUSEPORT and
// SO_REUSEADDR when asked.
func (o *Options) listen(ctx context.Context) (net.Listener, error) {
	host := "0.0.0.0"
	if o.BindAddress != nil {
		host = o.BindAddress.String()
	}
	addr := net.JoinHostPort(host, strconv.Itoa(o.BindPort))
	lc := net.ListenConfig{Control: socketControl(o.PermitPortSharing, o.PermitAddressSharing)}
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %v: %w", addr, err)
	}
	return ln, nil
}

// keepAliveListener turns TCP keep-alives on for every connection, every
// 3 minutes, as the kube-apiserver's serving does.
type keepAliveListener struct{ *net.TCPListener }

func (l keepAliveListener) Accept() (net.Conn, error) {
	c, err := l.AcceptTCP()
	if err != nil {
		return nil, err
	}
	_ = c.SetKeepAlive(true)
	_ = c.SetKeepAlivePeriod(3 * time.Minute)
	return c, nil
}

// handshakeErrors logs TLS handshake errors at level 1 (scanners and
// load balancer checks cause them), other server errors always.
type handshakeErrors struct{ logger klog.Logger }

func (h handshakeErrors) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	if strings.Contains(msg, "http: TLS handshake error") {
		h.logger.V(1).Info(msg)
	} else {
		h.logger.Info(msg)
	}
	return len(p), nil
}
