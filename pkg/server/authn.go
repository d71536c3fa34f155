package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/anonymous"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	unionauthn "k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/request/websocket"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/klog/v2"
)

const (
	// The kube-apiserver publishes the client CAs there.
	authenticationConfigMapNamespace = metav1.NamespaceSystem
	authenticationConfigMapName      = "extension-apiserver-authentication"
)

// reviewBackoff is how a TokenReview or SubjectAccessReview that failed is
// retried, as k8s.io/apiserver's DefaultAuthWebhookRetryBackoff.
func reviewBackoff() wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
}

// authentication is what authenticates a request, and the CAs the TLS
// handshake asks client certificates for.
type authentication struct {
	authenticator authenticator.Request
	clientCAs     []dynamiccertificates.CAContentProvider
	// runners are the certificate and configmap watchers to run.
	runners []dynamiccertificates.ControllerRunner
}

// newAuthentication builds what kube-controller-manager's delegating
// authentication builds: the front proxy's request headers (its client
// certificate checked first), client certificates, bearer tokens checked
// with a TokenReview (answers cached), in that order; the client CAs from
// the flags, else from the cluster's configmap; anonymous requests allowed
// only on the always-allowed paths.
func (o *Options) newAuthentication(ctx context.Context, client kubernetes.Interface) (*authentication, error) {
	logger := klog.FromContext(ctx)
	a := &authentication{}
	var authenticators []authenticator.Request

	// The front proxy first.
	switch {
	case o.RequestHeader.ClientCAFile != "":
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("request-header", o.RequestHeader.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("request-header client CA: %w", err)
		}
		a.add(ca)
		rh := o.RequestHeader
		authenticators = append(authenticators, headerrequest.NewDynamicVerifyOptionsSecure(ca.VerifyOptions,
			headerrequest.StaticStringSlice(rh.AllowedNames), headerrequest.StaticStringSlice(rh.UsernameHeaders),
			headerrequest.StaticStringSlice(rh.UIDHeaders), headerrequest.StaticStringSlice(rh.GroupHeaders),
			headerrequest.StaticStringSlice(rh.ExtraHeaderPrefixes)))
	case o.SkipInClusterLookup:
	case client == nil:
		logger.Info("No authentication-kubeconfig provided in order to lookup requestheader-client-ca-file in configmap, so request-header client certificate authentication won't work",
			"configmap", klog.KRef(authenticationConfigMapNamespace, authenticationConfigMapName))
	default:
		rh, err := newRequestHeaderFromCluster(ctx, client)
		if err != nil {
			if !o.TolerateInClusterLookupFailure {
				return nil, fmt.Errorf("unable to load configmap based request-header-client-ca-file: %w", err)
			}
			logger.Error(err, "Error looking up in-cluster authentication configuration; continuing without it, which may treat all requests as anonymous. To require it, set --authentication-tolerate-lookup-failure=false")
		} else {
			a.add(rh.ca)
			a.runners = append(a.runners, rh.names)
			authenticators = append(authenticators, headerrequest.NewDynamicVerifyOptionsSecure(rh.ca.VerifyOptions,
				headerrequest.StringSliceProviderFunc(rh.names.AllowedClientNames),
				headerrequest.StringSliceProviderFunc(rh.names.UsernameHeaders),
				headerrequest.StringSliceProviderFunc(rh.names.UIDHeaders),
				headerrequest.StringSliceProviderFunc(rh.names.GroupHeaders),
				headerrequest.StringSliceProviderFunc(rh.names.ExtraHeaderPrefixes)))
		}
	}

	// Client certificates.
	var clientCA dynamiccertificates.CAContentProvider
	switch {
	case o.ClientCAFile != "":
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", o.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("unable to load client CA provider: %w", err)
		}
		clientCA = ca
	case o.SkipInClusterLookup:
	case client == nil:
		logger.Info("No authentication-kubeconfig provided in order to lookup client-ca-file in configmap, so client certificate authentication won't work",
			"configmap", klog.KRef(authenticationConfigMapNamespace, authenticationConfigMapName))
	default:
		ca, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", authenticationConfigMapNamespace,
			authenticationConfigMapName, "client-ca-file", client)
		if err != nil {
			return nil, fmt.Errorf("unable to load configmap based client CA file: %w", err)
		}
		clientCA = ca
	}
	if clientCA != nil {
		a.add(clientCA)
		authenticators = append(authenticators, x509request.NewDynamic(clientCA.VerifyOptions, x509request.CommonNameUserConversion))
	}

	// Bearer tokens.
	if client != nil {
		tokens := tokencache.New(&tokenReviewer{client: client.AuthenticationV1(), backoff: reviewBackoff()}, false,
			o.TokenCacheTTL, o.TokenCacheTTL)
		authenticators = append(authenticators, bearertoken.New(tokens), websocket.NewProtocolAuthenticator(tokens))
	}

	anon := anonymous.NewAuthenticator(nil)
	var authn authenticator.Request = anon
	if len(authenticators) > 0 {
		authn = unionauthn.NewFailOnError(group.NewAuthenticatedGroupAdder(unionauthn.New(authenticators...)), anon)
	}
	a.authenticator = &probesOnlyAnonymous{inner: authn, paths: slices.Clone(o.AlwaysAllowPaths)}
	return a, nil
}

// add keeps a CA for the TLS handshake, and its watcher when it has one.
func (a *authentication) add(ca dynamiccertificates.CAContentProvider) {
	a.clientCAs = append(a.clientCAs, ca)
	if r, ok := ca.(dynamiccertificates.ControllerRunner); ok {
		a.runners = append(a.runners, r)
	}
}

// clusterRequestHeader is the front proxy's CA and header names as the
// kube-apiserver publishes them in its configmap, kept up to date.
type clusterRequestHeader struct {
	ca    *dynamiccertificates.ConfigMapCAController
	names *headerrequest.RequestHeaderAuthRequestController
}

func newRequestHeaderFromCluster(ctx context.Context, client kubernetes.Interface) (*clusterRequestHeader, error) {
	ca, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", authenticationConfigMapNamespace,
		authenticationConfigMapName, "requestheader-client-ca-file", client)
	if err != nil {
		return nil, fmt.Errorf("unable to create DynamicCAFromConfigMap controller: %w", err)
	}
	names := headerrequest.NewRequestHeaderAuthRequestController(authenticationConfigMapName, authenticationConfigMapNamespace,
		client, "requestheader-username-headers", "requestheader-uid-headers", "requestheader-group-headers",
		"requestheader-extra-headers-prefix", "requestheader-allowed-names")
	// The lookup must succeed now, unless tolerated.
	if err := errors.Join(ca.RunOnce(ctx), names.RunOnce(ctx)); err != nil {
		return nil, err
	}
	return &clusterRequestHeader{ca: ca, names: names}, nil
}

// tokenReviewer checks a bearer token with a TokenReview, as
// k8s.io/apiserver's webhook token authenticator does when it delegates to
// the kube-apiserver: retried with backoff, no audiences asked for.
type tokenReviewer struct {
	client  authenticationclient.AuthenticationV1Interface
	backoff wait.Backoff
}

var _ authenticator.Token = (*tokenReviewer)(nil)

// tokenReviewTimeout bounds each TokenReview.
const tokenReviewTimeout = 10 * time.Second

func (t *tokenReviewer) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	var result *authenticationv1.TokenReview
	err := retry(ctx, t.backoff, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, tokenReviewTimeout)
		defer cancel()
		var err error
		result, err = t.client.TokenReviews().Create(ctx, review, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		// An error, not a rejection: the answer is not cached.
		return nil, false, fmt.Errorf("token review: %w", err)
	}
	st := result.Status
	if !st.Authenticated {
		if st.Error != "" {
			return nil, false, errors.New(st.Error)
		}
		return nil, false, nil
	}
	var extra map[string][]string
	if st.User.Extra != nil {
		extra = make(map[string][]string, len(st.User.Extra))
		for k, v := range st.User.Extra {
			extra[k] = v
		}
	}
	return &authenticator.Response{
		Audiences: st.Audiences,
		User:      &user.DefaultInfo{Name: st.User.Username, UID: st.User.UID, Groups: st.User.Groups, Extra: extra},
	}, true, nil
}

// retry runs call until it succeeds, ctx ends or the backoff's steps are
// spent; it returns the last error.
func retry(ctx context.Context, backoff wait.Backoff, call func(context.Context) error) error {
	var last error
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		last = call(ctx)
		return last == nil, nil
	})
	if last != nil {
		return last
	}
	return err
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
