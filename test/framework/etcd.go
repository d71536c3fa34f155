package framework

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// portAttempts bounds the retries after losing a port to another process.
const portAttempts = 3

// startEtcd starts a single-member etcd and waits until it serves. It returns
// the client URL. On error a non-nil process is still running or unreaped:
// the caller stops it after reading its log.
func startEtcd(ctx context.Context, binary, dir string, extraFlags []string) (*Process, string, error) {
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
		err = waitFor(ctx, p.ExitError, "etcd health", func(ctx context.Context) bool { return etcdHealthy(ctx, clientURL) })
		if err == nil {
			logger.V(1).Info("Etcd is serving", "url", clientURL, "pid", p.Pid())
			return p, clientURL, nil
		}
		if attempt == portAttempts || p.ExitError() == nil || !p.lostPortRace() {
			return p, "", err
		}
		if err := p.Stop(0); err != nil {
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

// compactionKey is written before a compaction: outside the apiserver's
// /registry prefix, so that no object changes.
const compactionKey = "/adc-test/compaction"

// CompactEtcd compacts etcd's history at its current revision, after two
// writes of a key outside the apiserver's prefix: every resourceVersion a
// client holds is then older than the compaction, so a watch served from
// etcd (kube-apiserver's --watch-cache=false) started or resumed from one
// gets 410 Gone, "too old resource version", and an informer lists again.
// A watch already established goes on. It returns the revision compacted
// at.
//
// It talks to etcd's JSON gateway, which serves the v3 API on the client
// URL.
func (c *Cluster) CompactEtcd(ctx context.Context) (int64, error) {
	// Two writes: a watch resumed from resourceVersion R asks etcd for
	// R+1 on, which survives a compaction at R+1.
	var rev int64
	for range 2 {
		var resp struct {
			Header struct {
				Revision int64 `json:"revision,string"`
			} `json:"header"`
		}
		body := map[string]string{
			"key":   base64.StdEncoding.EncodeToString([]byte(compactionKey)),
			"value": base64.StdEncoding.EncodeToString([]byte(time.Now().Format(time.RFC3339Nano))),
		}
		if err := etcdCall(ctx, c.EtcdURL, "/v3/kv/put", body, &resp); err != nil {
			return 0, err
		}
		rev = resp.Header.Revision
	}
	if rev == 0 {
		return 0, errors.New("etcd put answered no revision")
	}
	body := map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}
	if err := etcdCall(ctx, c.EtcdURL, "/v3/kv/compaction", body, nil); err != nil {
		return 0, err
	}
	klog.FromContext(ctx).V(1).Info("Etcd compacted", "revision", rev)
	return rev, nil
}

// etcdCall posts body as JSON to etcd's gateway and decodes the answer into
// out, when not nil.
func etcdCall(ctx context.Context, clientURL, path string, body, out any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode etcd %s request: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, clientURL+path, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("etcd %s: %w", path, err)
	}
	defer func() { _ = resp.Body.Close() }() // read fully below
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("etcd %s: read answer: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, answer)
	}
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			return fmt.Errorf("etcd %s: decode %q: %w", path, answer, err)
		}
	}
	return nil
}
