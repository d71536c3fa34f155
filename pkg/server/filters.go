package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/klog/v2"
)

// withFilters wraps h as kube-controller-manager's secure port does: panic
// recovery, no caching of answers, authentication (401 when it fails),
// authorization of the non-resource request (403 when refused, 500 when
// it cannot be decided), and a timeout.
func withFilters(h http.Handler, authn authenticator.Request, authz authorizer.UnconditionalAuthorizer, timeout time.Duration) http.Handler {
	h = http.TimeoutHandler(h, timeout, "request timed out")
	h = withAuthorization(h, authz)
	h = withAuthentication(h, authn)
	h = withCacheControl(h)
	return withPanicRecovery(h)
}

type userKey struct{}

func withAuthentication(h http.Handler, authn authenticator.Request) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		resp, ok, err := authn.AuthenticateRequest(req)
		if err != nil || !ok {
			if err != nil {
				klog.FromContext(req.Context()).Error(err, "Unable to authenticate the request")
			}
			writeStatus(w, apierrors.NewUnauthorized("Unauthorized"))
			return
		}
		// The credentials go no further than here.
		req.Header.Del("Authorization")
		h.ServeHTTP(w, req.WithContext(context.WithValue(req.Context(), userKey{}, resp)))
	})
}

func withAuthorization(h http.Handler, authz authorizer.UnconditionalAuthorizer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		resp, _ := req.Context().Value(userKey{}).(*authenticator.Response)
		if resp == nil {
			writeStatus(w, apierrors.NewInternalError(errors.New("no user found for request")))
			return
		}
		attrs := authorizer.AttributesRecord{User: resp.User, Verb: strings.ToLower(req.Method), Path: req.URL.Path}
		decision, reason, err := authz.Authorize(req.Context(), attrs)
		if decision == authorizer.DecisionAllow {
			h.ServeHTTP(w, req)
			return
		}
		if err != nil {
			klog.FromContext(req.Context()).Error(err, "Authorization error", "user", resp.User.GetName(), "verb", attrs.Verb, "path", attrs.Path)
			writeStatus(w, apierrors.NewInternalError(err))
			return
		}
		msg := fmt.Sprintf("User %q cannot %s path %q", resp.User.GetName(), attrs.Verb, attrs.Path)
		if reason != "" {
			msg += ": " + reason
		}
		writeStatus(w, apierrors.NewForbidden(schema.GroupResource{}, "", errors.New(msg)))
	})
}

func withCacheControl(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if w.Header().Get("Cache-Control") == "" {
			w.Header().Set("Cache-Control", "no-cache, private")
		}
		h.ServeHTTP(w, req)
	})
}

func withPanicRecovery(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		defer func() {
			r := recover()
			if r == nil {
				return
			}
			if r == http.ErrAbortHandler { //nolint:errorlint // the sentinel value itself, as net/http panics it
				panic(r)
			}
			klog.FromContext(req.Context()).Error(fmt.Errorf("panic: %v", r), "Handler panicked", "method", req.Method, "path", req.URL.Path)
			writeStatus(w, apierrors.NewInternalError(fmt.Errorf("panic: %v", r)))
		}()
		h.ServeHTTP(w, req)
	})
}

// writeStatus answers with err's Status as JSON, as the kube-apiserver
// answers.
func writeStatus(w http.ResponseWriter, err *apierrors.StatusError) {
	st := err.Status()
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	body, mErr := json.Marshal(st)
	if mErr != nil {
		http.Error(w, st.Message, int(st.Code))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(int(st.Code))
	_, _ = w.Write(append(body, '\n'))
}
