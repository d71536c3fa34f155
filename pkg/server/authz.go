package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilcache "k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/client-go/kubernetes"
	authorizationclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/klog/v2"
)

// newAuthorizer builds what kube-controller-manager's delegating
// authorization builds: the always-allowed groups (system:masters), the
// always-allowed paths (the probes), then a SubjectAccessReview of the
// non-resource request, its answers cached. Without a client, what the
// first two do not allow is forbidden.
func (o *Options) newAuthorizer(ctx context.Context, client kubernetes.Interface) (authorizer.UnconditionalAuthorizer, error) {
	var authorizers firstOpinion
	if len(o.AlwaysAllowGroups) > 0 {
		authorizers = append(authorizers, privilegedGroups(slices.Clone(o.AlwaysAllowGroups)))
	}
	if len(o.AlwaysAllowPaths) > 0 {
		a, err := path.NewAuthorizer(o.AlwaysAllowPaths)
		if err != nil {
			return nil, fmt.Errorf("--authorization-always-allow-paths: %w", err)
		}
		authorizers = append(authorizers, a)
	}
	if client == nil {
		klog.FromContext(ctx).Info("No authorization-kubeconfig provided, so SubjectAccessReview of authorization tokens won't work")
	} else {
		authorizers = append(authorizers, &accessReviewer{
			client:   client.AuthorizationV1(),
			backoff:  reviewBackoff(),
			allowTTL: o.AllowCacheTTL,
			denyTTL:  o.DenyCacheTTL,
			answers:  utilcache.NewLRUExpireCache(8192),
		})
	}
	return authorizers, nil
}

// firstOpinion asks each authorizer in turn; the first to allow or deny
// decides; otherwise no opinion, with every reason and error given.
type firstOpinion []authorizer.UnconditionalAuthorizer

func (f firstOpinion) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	var reasons []string
	var errs []error
	for _, z := range f {
		decision, reason, err := z.Authorize(ctx, a)
		if err != nil {
			errs = append(errs, err)
		}
		if reason != "" {
			reasons = append(reasons, reason)
		}
		if decision == authorizer.DecisionAllow || decision == authorizer.DecisionDeny {
			return decision, reason, err
		}
	}
	return authorizer.DecisionNoOpinion, strings.Join(reasons, "\n"), errors.Join(errs...)
}

// privilegedGroups allows every request of a user in one of the groups.
type privilegedGroups []string

func (g privilegedGroups) Authorize(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if u := a.GetUser(); u != nil {
		for _, group := range u.GetGroups() {
			if slices.Contains(g, group) {
				return authorizer.DecisionAllow, "", nil
			}
		}
	}
	return authorizer.DecisionNoOpinion, "", nil
}

// accessReviewer asks the kube-apiserver with a SubjectAccessReview, as
// k8s.io/apiserver's webhook authorizer does when it delegates: retried
// with backoff; an allow cached for allowTTL, anything else for denyTTL,
// an error not at all.
type accessReviewer struct {
	client            authorizationclient.AuthorizationV1Interface
	backoff           wait.Backoff
	allowTTL, denyTTL time.Duration
	answers           *utilcache.LRUExpireCache
}

var _ authorizer.UnconditionalAuthorizer = (*accessReviewer)(nil)

// accessReviewTimeout bounds each SubjectAccessReview.
const accessReviewTimeout = 10 * time.Second

type accessAnswer struct {
	decision authorizer.Decision
	reason   string
}

func (r *accessReviewer) Authorize(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	spec := authorizationv1.SubjectAccessReviewSpec{}
	if u := a.GetUser(); u != nil {
		spec.User = u.GetName()
		spec.UID = u.GetUID()
		spec.Groups = u.GetGroups()
		if extra := u.GetExtra(); extra != nil {
			spec.Extra = make(map[string]authorizationv1.ExtraValue, len(extra))
			for k, v := range extra {
				spec.Extra[k] = v
			}
		}
	}
	if a.IsResourceRequest() {
		spec.ResourceAttributes = &authorizationv1.ResourceAttributes{
			Namespace: a.GetNamespace(), Verb: a.GetVerb(), Group: a.GetAPIGroup(), Version: a.GetAPIVersion(),
			Resource: a.GetResource(), Subresource: a.GetSubresource(), Name: a.GetName(),
		}
	} else {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: a.GetPath(), Verb: a.GetVerb()}
	}
	keyBytes, err := json.Marshal(spec)
	if err != nil {
		return authorizer.DecisionNoOpinion, "", fmt.Errorf("subject access review key: %w", err)
	}
	key := string(keyBytes)
	if v, ok := r.answers.Get(key); ok {
		ans := v.(accessAnswer)
		return ans.decision, ans.reason, nil
	}
	var result *authorizationv1.SubjectAccessReview
	err = retry(ctx, r.backoff, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, accessReviewTimeout)
		defer cancel()
		var err error
		result, err = r.client.SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return authorizer.DecisionNoOpinion, "", fmt.Errorf("subject access review: %w", err)
	}
	st := result.Status
	ans := accessAnswer{decision: authorizer.DecisionNoOpinion, reason: st.Reason}
	switch {
	case st.Allowed:
		ans.decision = authorizer.DecisionAllow
		r.answers.Add(key, ans, r.allowTTL)
	case st.Denied:
		ans.decision = authorizer.DecisionDeny
		r.answers.Add(key, ans, r.denyTTL)
	default:
		r.answers.Add(key, ans, r.denyTTL)
	}
	return ans.decision, ans.reason, nil
}
