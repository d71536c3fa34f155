package process

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// startSecure runs one replica serving its secure port on loopback, and its
// plain HTTP endpoint.
func startSecure(t *testing.T, lease string, extra ...string) (c *framework.Controller, secureURL string) {
	t.Helper()
	securePort, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{
		"--secure-port", fmt.Sprint(securePort),
		"--bind-address", "127.0.0.1",
		"-v", "2",
	}, leaseFlags(lease)...)
	c = framework.StartControllerT(t, framework.ControllerOptions{
		Binary:     binary,
		Kubeconfig: cluster.Kubeconfig,
		HTTP:       true,
		Args:       append(args, extra...),
	})
	return c, fmt.Sprintf("https://127.0.0.1:%d", securePort)
}

// The certificate is self-signed: the test checks who may read, not the
// certificate chain.
var insecureClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // self-signed by design
}

func getAs(url, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := insecureClient.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func serviceAccountToken(ctx context.Context, t *testing.T, ns, name string) string {
	t.Helper()
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if _, err := cluster.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tok, err := cluster.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tok.Status.Token
}

// shippedClusterRoles reads the ClusterRoles of manifests/base/endpoint-readers.yaml.
func shippedClusterRoles(t *testing.T) map[string]*rbacv1.ClusterRole {
	t.Helper()
	root, err := framework.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "manifests", "base", "endpoint-readers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]*rbacv1.ClusterRole{}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var r rbacv1.ClusterRole
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatal(err)
		}
		roles[r.Name] = &r
	}
	return roles
}

func bind(ctx context.Context, t *testing.T, role *rbacv1.ClusterRole, ns, sa string) {
	t.Helper()
	if _, err := cluster.Client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name + "-" + sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
	}
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestSecureEndpoint checks who can read what on the secure port, with
// tokens checked and paths authorized by the real kube-apiserver.
func TestSecureEndpoint(t *testing.T) {
	ctx := context.Background()
	const ns = "adc-readers"
	if _, err := framework.CreateNamespace(ctx, cluster.Client, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p, secure := startSecure(t, "adc-secure")
	plain := p.HTTPURL
	framework.Eventually(t, 60*time.Second, func() (bool, error) {
		return strings.Contains(p.Output(), "Became leader"), nil
	}, "the replica leads")

	none := serviceAccountToken(ctx, t, ns, "no-rbac")
	metricsReader := serviceAccountToken(ctx, t, ns, "metrics-reader")
	explainer := serviceAccountToken(ctx, t, ns, "explainer")
	roles := shippedClusterRoles(t)
	for name, sa := range map[string]string{
		"attach-detach-controller:metrics-reader": "metrics-reader",
		"attach-detach-controller:explain":        "explainer",
	} {
		role, ok := roles[name]
		if !ok {
			t.Fatalf("manifests/base/endpoint-readers.yaml has no ClusterRole %s", name)
		}
		bind(ctx, t, role, ns, sa)
	}

	const explain = "/explain?pod=kube-system/nothing"
	for _, c := range []struct {
		who, token, path string
		want             int
	}{
		{"anonymous", "", "/healthz", http.StatusOK},
		{"anonymous", "", "/readyz", http.StatusOK},
		{"anonymous", "", "/livez", http.StatusOK},
		{"anonymous", "", "/metrics", http.StatusUnauthorized},
		{"anonymous", "", explain, http.StatusUnauthorized},
		{"an invalid token", "not-a-token", "/metrics", http.StatusUnauthorized},
		{"a service account without RBAC", none, "/metrics", http.StatusForbidden},
		{"a service account without RBAC", none, explain, http.StatusForbidden},
		{"a service account without RBAC", none, "/healthz", http.StatusOK},
		{"the metrics reader", metricsReader, "/metrics", http.StatusOK},
		{"the metrics reader", metricsReader, explain, http.StatusForbidden},
		{"the explain reader", explainer, explain, http.StatusOK},
		{"the explain reader", explainer, "/metrics", http.StatusForbidden},
		// /shadow has the readers of /explain; outside shadow mode it
		// answers 404.
		{"anonymous", "", "/shadow", http.StatusUnauthorized},
		{"the metrics reader", metricsReader, "/shadow", http.StatusForbidden},
		{"the explain reader", explainer, "/shadow", http.StatusNotFound},
		{"an admin (system:masters)", cluster.Config.BearerToken, "/metrics", http.StatusOK},
	} {
		// Polled: RBAC bindings reach the authorizer's cache within moments.
		var got int
		ok := framework.Poll(t, 20*time.Second, func() (bool, error) {
			code, err := getAs(secure+c.path, c.token)
			got = code
			return err == nil && code == c.want, nil
		})
		if !ok {
			t.Errorf("%s GET %s: %d, want %d", c.who, c.path, got, c.want)
		}
	}

	// The plain endpoint is for local use: never /explain nor /shadow.
	for _, path := range []string{explain, "/shadow"} {
		code, err := getAs(plain+path, "")
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusNotFound {
			t.Errorf("--http-endpoint GET %s: %d, want 404", path, code)
		}
	}
	if code, err := getAs(plain+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Errorf("--http-endpoint GET /healthz: %d (%v), want 200", code, err)
	}
}

// TestSecureEndpointProtocols: the secure port speaks HTTP/2 to a client
// that offers it (the kube-apiserver's frame and stream settings), and
// HTTP/1.1 alone with --disable-http2-serving.
func TestSecureEndpointProtocols(t *testing.T) {
	for _, c := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"default", nil, "HTTP/2.0"},
		{"disable-http2-serving", []string{"--disable-http2-serving"}, "HTTP/1.1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, secure := startSecure(t, "adc-protocols-"+c.name, c.extra...)
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // self-signed by design
				ForceAttemptHTTP2: true,
			}}
			var proto string
			ok := framework.Poll(t, 30*time.Second, func() (bool, error) {
				resp, err := client.Get(secure + "/healthz")
				if err != nil {
					return false, nil
				}
				_ = resp.Body.Close()
				proto = resp.Proto
				return resp.StatusCode == http.StatusOK, nil
			})
			if !ok {
				t.Fatalf("GET %s/healthz never answered 200", secure)
			}
			if proto != c.want {
				t.Errorf("GET /healthz over %s, want %s", proto, c.want)
			}
		})
	}
}
