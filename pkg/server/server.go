// Package server serves the controller's endpoints (/metrics, /explain,
// /healthz, /readyz, /livez) over HTTPS, behind the API server's own
// authentication and authorization, as kube-controller-manager serves its
// secure port:
//
//   - a bearer token is checked with a TokenReview (client certificates
//     against the cluster's client CA, as published in
//     kube-system/extension-apiserver-authentication);
//   - access is a SubjectAccessReview of the non-resource path: `get
//     /metrics`, `get /explain`;
//   - the paths of --authorization-always-allow-paths (/healthz, /readyz,
//     /livez) are answered without either, so that kubelet's probes need no
//     token.
//
// Unlike kube-controller-manager, a request without credentials is refused
// with 401 on every other path rather than authorized as system:anonymous:
// nothing but the probes is readable without a token.
//
// The work is done by k8s.io/apiserver (its delegating authenticator and
// authorizer, caches of 10s for answers, its TLS serving with a self-signed
// certificate generated in memory when none is given); this package only
// chooses the options and builds the filter chain.
package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapifilters "k8s.io/apiserver/pkg/endpoints/filters"
	apirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericserver "k8s.io/apiserver/pkg/server"
	genericfilters "k8s.io/apiserver/pkg/server/filters"
	apiserveroptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	netutils "k8s.io/utils/net"
)

// DefaultPort is the default --secure-port.
const DefaultPort = 10262

// RequestTimeout bounds the time a request may take once its headers are
// read; the TLS server bounds header reads (32s), idle connections (90s)
// and header size (1 MiB).
const RequestTimeout = 30 * time.Second

// Options are the flags of the secure endpoint, named as
// kube-controller-manager names them.
type Options struct {
	SecureServing  *apiserveroptions.SecureServingOptions
	Authentication *apiserveroptions.DelegatingAuthenticationOptions
	Authorization  *apiserveroptions.DelegatingAuthorizationOptions
}

// NewOptions returns kube-controller-manager's defaults, with this
// controller's port and certificate name.
func NewOptions() *Options {
	o := &Options{
		SecureServing:  apiserveroptions.NewSecureServingOptions(),
		Authentication: apiserveroptions.NewDelegatingAuthenticationOptions(),
		Authorization:  apiserveroptions.NewDelegatingAuthorizationOptions(),
	}
	// The certificate is generated in memory when none is given.
	o.SecureServing.ServerCert.CertDirectory = ""
	o.SecureServing.ServerCert.PairName = "attach-detach-controller"
	o.SecureServing.BindPort = DefaultPort
	// Outside a cluster (a test, a local run) the kubeconfig of the
	// controller is used; see config.
	o.Authentication.RemoteKubeConfigFileOptional = true
	o.Authorization.RemoteKubeConfigFileOptional = true
	return o
}

// AddFlags binds the options to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	o.SecureServing.AddFlags(fs)
	o.Authentication.AddFlags(fs)
	o.Authorization.AddFlags(fs)
}

// Validate refuses inconsistent values.
func (o *Options) Validate() []error {
	var errs []error
	errs = append(errs, o.SecureServing.Validate()...)
	errs = append(errs, o.Authentication.Validate()...)
	errs = append(errs, o.Authorization.Validate()...)
	return errs
}

// enabled says whether the secure endpoint is served (--secure-port 0
// turns it off).
func (o *Options) enabled() bool {
	return o.SecureServing.BindPort != 0 || o.SecureServing.Listener != nil
}

// Serve serves h behind the filter chain until ctx is cancelled, unless
// --secure-port is 0; stop cancels it and waits until it has stopped.
// kubeconfig is as for config.
func (o *Options) Serve(ctx context.Context, kubeconfig string, h http.Handler) (stop func(), err error) {
	if !o.enabled() {
		return func() {}, nil
	}
	srv, err := o.config(kubeconfig)
	if err != nil {
		return nil, err
	}
	serveCtx, cancel := context.WithCancel(ctx)
	stopped, err := srv.Serve(serveCtx, h)
	if err != nil {
		cancel()
		return nil, err
	}
	klog.FromContext(ctx).Info("Serving securely", "address", srv.Address())
	return func() {
		cancel()
		<-stopped
	}, nil
}

// secureServer is the configured secure endpoint.
type secureServer struct {
	serving           *genericserver.SecureServingInfo
	authentication    genericserver.AuthenticationInfo
	authorization     genericserver.AuthorizationInfo
	alwaysAllowPaths  []string
	shutdownTimeout   time.Duration
	requestTimeout    time.Duration
	anonymousRejected bool
}

// config resolves the options: the certificate (self-signed when none is
// given), the listener, the TokenReview and SubjectAccessReview clients.
// kubeconfig, when not empty, is used for the reviews unless
// --authentication-kubeconfig / --authorization-kubeconfig say otherwise;
// empty means the in-cluster configuration.
func (o *Options) config(kubeconfig string) (*secureServer, error) {
	if o.Authentication.RemoteKubeConfigFile == "" {
		o.Authentication.RemoteKubeConfigFile = kubeconfig
	}
	if o.Authorization.RemoteKubeConfigFile == "" {
		o.Authorization.RemoteKubeConfigFile = kubeconfig
	}
	if err := o.SecureServing.MaybeDefaultWithSelfSignedCerts("localhost", nil, []net.IP{netutils.ParseIPSloppy("127.0.0.1")}); err != nil {
		return nil, fmt.Errorf("self-signed serving certificate: %w", err)
	}
	s := &secureServer{
		alwaysAllowPaths:  slices.Clone(o.Authorization.AlwaysAllowPaths),
		shutdownTimeout:   5 * time.Second,
		requestTimeout:    RequestTimeout,
		anonymousRejected: true,
	}
	if err := o.SecureServing.ApplyTo(&s.serving); err != nil {
		return nil, fmt.Errorf("secure serving: %w", err)
	}
	if err := o.Authentication.ApplyTo(&s.authentication, s.serving, nil); err != nil {
		return nil, fmt.Errorf("delegated authentication: %w", err)
	}
	if err := o.Authorization.ApplyTo(&s.authorization); err != nil {
		return nil, fmt.Errorf("delegated authorization: %w", err)
	}
	return s, nil
}

// Address is where the server listens.
func (s *secureServer) Address() string { return s.serving.Listener.Addr().String() }

// Handler wraps h in the filter chain: panic recovery, request info,
// authentication, authorization, a request timeout.
func (s *secureServer) Handler(h http.Handler) http.Handler {
	resolver := &apirequest.RequestInfoFactory{}
	handler := http.TimeoutHandler(h, s.requestTimeout, "request timed out")
	handler = genericapifilters.WithAuthorization(handler, s.authorization.Authorizer, scheme.Codecs)
	authn := s.authentication.Authenticator
	if s.anonymousRejected {
		authn = &probesOnlyAnonymous{inner: authn, paths: s.alwaysAllowPaths}
	}
	handler = genericapifilters.WithAuthentication(handler, authn, genericapifilters.Unauthorized(scheme.Codecs), nil, nil)
	handler = genericapifilters.WithRequestInfo(handler, resolver)
	handler = genericapifilters.WithCacheControl(handler)
	handler = genericfilters.WithPanicRecovery(handler, resolver)
	return handler
}

// Serve serves h behind the filter chain until ctx is cancelled; the
// returned channel is closed once the server has stopped and its requests
// are done.
func (s *secureServer) Serve(ctx context.Context, h http.Handler) (<-chan struct{}, error) {
	stopped, _, err := s.serving.Serve(s.Handler(h), s.shutdownTimeout, ctx.Done())
	if err != nil {
		return nil, fmt.Errorf("serve on %s: %w", s.Address(), err)
	}
	return stopped, nil
}

// probesOnlyAnonymous lets a request without credentials through as
// system:anonymous only on the always-allowed paths; elsewhere it is not
// authenticated (401), not merely forbidden.
type probesOnlyAnonymous struct {
	inner authenticator.Request
	paths []string
}

var _ authenticator.Request = (*probesOnlyAnonymous)(nil)

func (a *probesOnlyAnonymous) AuthenticateRequest(req *http.Request) (*authenticator.Response, bool, error) {
	resp, ok, err := a.inner.AuthenticateRequest(req)
	if err != nil || !ok || resp == nil || resp.User == nil {
		return resp, ok, err
	}
	if resp.User.GetName() == user.Anonymous && !slices.Contains(a.paths, req.URL.Path) {
		return nil, false, nil
	}
	return resp, ok, err
}
