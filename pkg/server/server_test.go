package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// reviews answers TokenReviews and SubjectAccessReviews as a kube-apiserver
// whose RBAC lets "reader" get /metrics, and counts them.
type reviews struct {
	tokens, accesses atomic.Int32
}

func (r *reviews) client() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r.tokens.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		switch tr.Spec.Token {
		case "reader-token":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "reader"}}
		case "nobody-token":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "nobody"}}
		case "admin-token":
			tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true,
				User: authenticationv1.UserInfo{Username: "admin", Groups: []string{"system:masters"}}}
		default:
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r.accesses.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview)
		na := sar.Spec.NonResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "reader" && na != nil && na.Path == "/metrics" && na.Verb == "get"
		return true, sar, nil
	})
	return c
}

func TestSecureEndpointAccess(t *testing.T) {
	ctx := context.Background()
	r := &reviews{}
	client := r.client()
	o := NewOptions()
	o.SkipInClusterLookup = true
	authn, err := o.newAuthentication(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	authz, err := o.newAuthorizer(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	h := withFilters(ok, authn.authenticator, authz, time.Minute)

	for _, c := range []struct {
		who, token, method, path string
		want                     int
	}{
		{"anonymous", "", http.MethodGet, "/healthz", http.StatusOK},
		{"anonymous", "", http.MethodGet, "/readyz", http.StatusOK},
		{"anonymous", "", http.MethodGet, "/livez", http.StatusOK},
		{"anonymous", "", http.MethodGet, "/metrics", http.StatusUnauthorized},
		{"an invalid token", "bad", http.MethodGet, "/metrics", http.StatusUnauthorized},
		{"an invalid token", "bad", http.MethodGet, "/healthz", http.StatusUnauthorized},
		{"a user without RBAC", "nobody-token", http.MethodGet, "/metrics", http.StatusForbidden},
		{"a user without RBAC", "nobody-token", http.MethodGet, "/healthz", http.StatusOK},
		{"the reader", "reader-token", http.MethodGet, "/metrics", http.StatusOK},
		{"the reader", "reader-token", http.MethodPost, "/metrics", http.StatusForbidden},
		{"the reader", "reader-token", http.MethodGet, "/explain", http.StatusForbidden},
		{"system:masters", "admin-token", http.MethodGet, "/explain", http.StatusOK},
	} {
		req := httptest.NewRequest(c.method, c.path, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != c.want {
			t.Errorf("%s %s %s: %d, want %d (%s)", c.who, c.method, c.path, w.Code, c.want, w.Body.String())
		}
		if w.Code != http.StatusOK && w.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s %s %s: refused without a Status: %q", c.who, c.method, c.path, w.Body.String())
		}
	}

	// Answers are cached: asking again reviews nothing.
	tokens, accesses := r.tokens.Load(), r.accesses.Load()
	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		req.Header.Set("Authorization", "Bearer reader-token")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("the reader again: %d", w.Code)
		}
	}
	if r.tokens.Load() != tokens || r.accesses.Load() != accesses {
		t.Errorf("cached answers asked again: %d token reviews, %d access reviews after %d, %d",
			r.tokens.Load(), r.accesses.Load(), tokens, accesses)
	}
}

// TestForbiddenMessage: the refusal names the user, verb and path, as the
// kube-apiserver's does.
func TestForbiddenMessage(t *testing.T) {
	ctx := context.Background()
	r := &reviews{}
	o := NewOptions()
	o.SkipInClusterLookup = true
	authn, err := o.newAuthentication(ctx, r.client())
	if err != nil {
		t.Fatal(err)
	}
	authz, err := o.newAuthorizer(ctx, r.client())
	if err != nil {
		t.Fatal(err)
	}
	h := withFilters(http.NotFoundHandler(), authn.authenticator, authz, time.Minute)
	req := httptest.NewRequest(http.MethodGet, "/explain", nil)
	req.Header.Set("Authorization", "Bearer nobody-token")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	const want = `forbidden: User \"nobody\" cannot get path \"/explain\"`
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), want) {
		t.Errorf("got %d %s, want 403 with %s", w.Code, w.Body.String(), want)
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		name  string
		set   func(*Options)
		valid bool
	}{
		{"defaults", func(*Options) {}, true},
		{"port out of range", func(o *Options) { o.BindPort = 70000 }, false},
		{"port off", func(o *Options) { o.BindPort = 0 }, true},
		{"cert without key", func(o *Options) { o.CertFile = "a.crt" }, false},
		{"unknown cipher", func(o *Options) { o.CipherSuites = []string{"nope"} }, false},
		{"unknown TLS version", func(o *Options) { o.MinTLSVersion = "VersionTLS99" }, false},
		{"blank header", func(o *Options) { o.RequestHeader.GroupHeaders = []string{" "} }, false},
		{"star inside a path", func(o *Options) { o.AlwaysAllowPaths = []string{"/a*b"} }, false},
		{"star at the end", func(o *Options) { o.AlwaysAllowPaths = []string{"/debug/*"} }, true},
	} {
		o := NewOptions()
		c.set(o)
		if errs := o.Validate(); (len(errs) == 0) != c.valid {
			t.Errorf("%s: Validate() = %v, want valid %v", c.name, errs, c.valid)
		}
	}
}
