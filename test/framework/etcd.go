package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// portAttempts bounds the retries after losing a port to another process.
const portAttempts = 3

// startEtcd starts a single-member etcd and waits until it serves. It returns
// the client URL. On error a non-nil process is still running or unreaped:
// the caller stops it after reading its log.
func startEtcd(ctx context.Context, binary, dir string, extraFlags []string) (*process, string, error) {
	logger := klog.FromContext(ctx)
	dataDir := filepath.Join(dir, "etcd-data")
	for attempt := 1; ; attempt++ {
		clientPort, err := freePort()
		if err != nil {
			return nil, "", err
		}
		peerPort, err := freePort()
		if err != nil {
			return nil, "", err
		}
		clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
		// A failed attempt may have bootstrapped a member with other URLs.
		if err := os.RemoveAll(dataDir); err != nil {
			return nil, "", fmt.Errorf("clear etcd data dir: %w", err)
		}
		args := append([]string{
			"--name=test",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=test=" + peerURL,
			"--initial-cluster-state=new",
			// The data dies with the test: durability only costs time.
			"--unsafe-no-fsync=true",
			"--quota-backend-bytes=8589934592",
			"--snapshot-count=10000",
			// Info level is a page per start; the tail of a failed start
			// should show the warnings and errors.
			"--log-level=warn",
		}, extraFlags...)
		p, err := startProcess(ctx, dir, "etcd", binary, args...)
		if err != nil {
			return nil, "", err
		}
		err = waitFor(ctx, p, "etcd health", func(ctx context.Context) bool { return etcdHealthy(ctx, clientURL) })
		if err == nil {
			logger.V(1).Info("Etcd is serving", "url", clientURL, "pid", p.pid())
			return p, clientURL, nil
		}
		if attempt == portAttempts || p.exitError() == nil || !p.lostPortRace() {
			return p, "", err
		}
		if err := p.stop(); err != nil {
			return nil, "", err
		}
		logger.Info("Etcd lost a port race, retrying with other ports", "attempt", attempt)
	}
}

func etcdHealthy(ctx context.Context, clientURL string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer func() { _ = resp.Body.Close() }() // response fully read or irrelevant
	body, err := io.ReadAll(resp.Body)
	return err == nil && resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"health":"true"`)
}
