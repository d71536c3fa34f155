package framework

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// serviceAccountIssuer is also the audience of service account tokens.
const serviceAccountIssuer = "https://kubernetes.default.svc"

// credentials are the files kube-apiserver reads at start-up.
type credentials struct {
	adminToken     string
	tokenFile      string // static token auth: the admin in system:masters
	serviceAcctKey string // RSA private key in PEM, signs and verifies tokens
}

func writeCredentials(dir string) (*credentials, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("generate admin token: %w", err)
	}
	creds := &credentials{
		adminToken:     hex.EncodeToString(raw),
		tokenFile:      filepath.Join(dir, "tokens.csv"),
		serviceAcctKey: filepath.Join(dir, "service-account.key"),
	}
	// token,user,uid,"group,..."
	line := creds.adminToken + ",admin,admin,system:masters\n"
	if err := os.WriteFile(creds.tokenFile, []byte(line), 0o600); err != nil {
		return nil, fmt.Errorf("write token file: %w", err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generate service account key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(creds.serviceAcctKey, keyPEM, 0o600); err != nil {
		return nil, fmt.Errorf("write service account key: %w", err)
	}
	return creds, nil
}

// startAPIServer starts kube-apiserver against etcdURL and waits for /readyz.
// It returns an admin config. On error a non-nil process is still running or
// unreaped: the caller stops it after reading its log.
func startAPIServer(ctx context.Context, binary, dir, etcdURL string, creds *credentials, extraFlags []string) (*Process, *rest.Config, error) {
	logger := klog.FromContext(ctx)
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, nil, err
		}
		args := append([]string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			// Without it the apiserver looks for a host interface with a
			// default route, which a sandbox may not have.
			"--advertise-address=127.0.0.1",
			// From v1.37 the endpoint reconciler refuses a loopback
			// address ("may not be in the loopback range") and the server
			// exits; nothing here reaches the apiserver through the
			// kubernetes Service, so its endpoints need no keeping.
			"--endpoint-reconciler-type=none",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + filepath.Join(dir, "apiserver-certs"),
			"--token-auth-file=" + creds.tokenFile,
			"--authorization-mode=RBAC",
			"--service-account-issuer=" + serviceAccountIssuer,
			"--service-account-key-file=" + creds.serviceAcctKey,
			"--service-account-signing-key-file=" + creds.serviceAcctKey,
			"--api-audiences=" + serviceAccountIssuer,
			// No controller creates service accounts or their tokens here.
			"--disable-admission-plugins=ServiceAccount",
			"--enable-priority-and-fairness=false",
			"--service-cluster-ip-range=10.0.0.0/24",
			"--allow-privileged=true",
		}, extraFlags...)
		p, err := startProcess(ctx, dir, "kube-apiserver", binary, args...)
		if err != nil {
			return nil, nil, err
		}
		config := adminConfig(fmt.Sprintf("https://127.0.0.1:%d", port), creds.adminToken)
		err = waitForReadyz(ctx, p, config)
		if err == nil {
			logger.V(1).Info("Kube-apiserver is ready", "host", config.Host, "pid", p.Pid())
			return p, config, nil
		}
		if attempt == portAttempts || p.ExitError() == nil || !p.lostPortRace() {
			return p, nil, err
		}
		if err := p.Stop(0); err != nil {
			return nil, nil, err
		}
		logger.Info("Kube-apiserver lost a port race, retrying with another port", "attempt", attempt)
	}
}

func adminConfig(host, token string) *rest.Config {
	return &rest.Config{
		Host:        host,
		BearerToken: token,
		// The serving certificate is self-signed and regenerated per cluster.
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		// One admin against a private apiserver: client-side throttling
		// would only slow tests down. Components under test set their own.
		QPS:       -1,
		UserAgent: "adc-test-framework",
	}
}

func waitForReadyz(ctx context.Context, p *Process, config *rest.Config) error {
	probe := rest.CopyConfig(config)
	probe.Timeout = 5 * time.Second
	client, err := kubernetes.NewForConfig(probe)
	if err != nil {
		return fmt.Errorf("create readiness client: %w", err)
	}
	return waitFor(ctx, p.ExitError, "kube-apiserver /readyz", func(ctx context.Context) bool {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil
	})
}
