package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// identityNamespace holds the controllers' service accounts.
const identityNamespace = "kube-system"

// tokenSeconds outlives the longest run (large, both controllers).
const tokenSeconds = 24 * 3600

// Identity is the user a controller runs as.
type Identity struct {
	User       string // as the audit log names it
	Kubeconfig string
}

// userOf is the service account user a controller named name runs as.
func userOf(name string) string {
	return "system:serviceaccount:" + identityNamespace + ":adcbench-" + name
}

// StartCluster starts etcd and kube-apiserver (from binDir) with limits out
// of the way (no priority and fairness, many requests in flight), no PVC/PV
// protection finalizers (no controller would remove them), and an audit log
// of the given controllers' requests in dir/audit.log.
func StartCluster(logger klog.Logger, binDir, dir string, controllers []string) (*framework.Cluster, string, error) {
	users := make([]string, 0, len(controllers))
	for _, c := range controllers {
		users = append(users, userOf(c))
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy(users)), 0o644); err != nil {
		return nil, "", fmt.Errorf("write audit policy: %w", err)
	}
	auditLog := filepath.Join(dir, "audit.log")
	c, err := framework.Start(framework.Options{
		Logger: logger,
		BinDir: binDir,
		APIServerFlags: []string{
			"--enable-priority-and-fairness=false",
			"--max-requests-inflight=3000",
			"--max-mutating-requests-inflight=1000",
			"--disable-admission-plugins=StorageObjectInUseProtection",
			// The cleanup between two controllers' runs deletes 100,000
			// pods, claims and PVs at the largest size: one worker (the
			// default) does a few hundred a second.
			"--delete-collection-workers=4",
			"--audit-policy-file=" + policy,
			"--audit-log-path=" + auditLog,
			"--audit-log-format=json",
			"--audit-log-mode=blocking",
			"--audit-log-maxsize=0",
		},
	})
	if err != nil {
		return nil, "", err
	}
	return c, auditLog, nil
}

// NewIdentity creates a service account for the controller named name, bound
// to cluster-admin (both controllers get the same authorization path), and
// writes a kubeconfig with a token of it into dir.
func NewIdentity(ctx context.Context, c *framework.Cluster, dir, name string) (Identity, error) {
	sa := "adcbench-" + name
	client := c.Client
	_, err := client.CoreV1().Namespaces().Create(ctx, framework.Namespace(identityNamespace), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return Identity{}, fmt.Errorf("create namespace %s: %w", identityNamespace, err)
	}
	_, err = client.CoreV1().ServiceAccounts(identityNamespace).Create(ctx,
		&v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return Identity{}, fmt.Errorf("create service account %s: %w", sa, err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: identityNamespace, Name: sa}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return Identity{}, fmt.Errorf("bind %s to cluster-admin: %w", sa, err)
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(tokenSeconds))}}
	token, err := client.CoreV1().ServiceAccounts(identityNamespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return Identity{}, fmt.Errorf("request token of %s: %w", sa, err)
	}
	path := filepath.Join(dir, name+".kubeconfig")
	config := clientcmdapi.NewConfig()
	config.Clusters["bench"] = &clientcmdapi.Cluster{Server: c.Config.Host, InsecureSkipTLSVerify: true}
	config.AuthInfos["bench"] = &clientcmdapi.AuthInfo{Token: token.Status.Token}
	config.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: "bench"}
	config.CurrentContext = "bench"
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		return Identity{}, fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return Identity{User: userOf(name), Kubeconfig: path}, nil
}
