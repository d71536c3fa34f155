package deploy

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestSecurePortWithShippedRBAC runs the controller as the Deployment does,
// with its service account's token and the manifests' RBAC (its ClusterRole
// plus the auth delegation bindings), serving its secure port: the shipped
// bindings suffice to check callers with TokenReviews and
// SubjectAccessReviews. Who may read what is checked in
// test/integration/process (TestSecureEndpoint).
func TestSecurePortWithShippedRBAC(t *testing.T) {
	r := renderBase(t)
	kubeconfig := serviceAccountKubeconfig(t, r)
	ctx := t.Context()
	crb := convert[rbacv1.ClusterRoleBinding](t, find(t, r.objects, "ClusterRoleBinding", "attach-detach-controller:auth-delegator"))
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := convert[rbacv1.RoleBinding](t, find(t, r.objects, "RoleBinding", "attach-detach-controller:authentication-reader"))
	if _, err := cluster.Client.RbacV1().RoleBindings(rb.Namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := startController(t, r, kubeconfig, []string{fmt.Sprintf("--secure-port=%d", port), "--bind-address=127.0.0.1"})
	defer stopController(t, c)
	waitStarted(t, c)

	client := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed by design
	get := func(path, token string) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d%s", port, path), nil)
		if err != nil {
			return 0, err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for _, tc := range []struct {
		what, path, token string
		want              int
	}{
		{"anonymous", "/healthz", "", http.StatusOK},
		{"anonymous", "/metrics", "", http.StatusUnauthorized},
		// The admin's token is reviewed (TokenReview) and found in
		// system:masters, which is always allowed.
		{"an admin", "/metrics", cluster.Config.BearerToken, http.StatusOK},
		// The controller's own token is valid but not allowed get /metrics
		// (SubjectAccessReview).
		{"the controller's service account", "/metrics", saToken(t, kubeconfig), http.StatusForbidden},
	} {
		var got int
		if !framework.Poll(t, 20*time.Second, func() (bool, error) {
			code, err := get(tc.path, tc.token)
			got = code
			return err == nil && code == tc.want, nil
		}) {
			t.Errorf("%s GET %s: %d, want %d", tc.what, tc.path, got, tc.want)
		}
	}
}

// saToken is the bearer token of a kubeconfig file.
func saToken(t *testing.T, kubeconfig string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		if a.Token != "" {
			return a.Token
		}
	}
	t.Fatalf("%s has no token", kubeconfig)
	return ""
}
