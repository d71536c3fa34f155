package process

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// cutProxy forwards TCP to the API server until cut: then every
// connection is closed and new ones are refused, as when the API server
// (or the network to it) goes away.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(p.Cut)
	go p.serve()
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

// Cut closes the listener and every connection.
func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// kubeconfigVia writes a copy of the admin kubeconfig whose server is the
// proxy.
func kubeconfigVia(t *testing.T, p *cutProxy) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + p.ln.Addr().String()
	}
	path := filepath.Join(t.TempDir(), "via-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestLeaderLosesAPIServer: a leader that can no longer reach the API
// server past its renew deadline exits non-zero; the standby takes the
// Lease; the volume attached meanwhile is never detached.
func TestLeaderLosesAPIServer(t *testing.T) {
	ctx := context.Background()
	const (
		lease  = "adc-leaseloss"
		ns     = "adc-leaseloss"
		node   = "leaseloss-node"
		driver = "leaseloss.csi.example.com"
		handle = "leaseloss-vol"
	)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{driver}})
	if _, err := framework.CreateNamespace(ctx, cluster.Client, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := framework.CreateNode(ctx, cluster.Client, framework.Node(node)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := framework.CreateBoundPVC(ctx, cluster.Client, ns, "data", framework.CSISource(driver, handle)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreatePod(ctx, cluster.Client, ns, "app", node, "data"); err != nil {
		t.Fatal(err)
	}
	vaName := framework.VolumeAttachmentName(handle, driver, node)
	// Kubelet mounts it: from now on a detach would be a detach in use.
	if err := framework.SetVolumesInUse(ctx, cluster.Client, node, framework.CSIVolumeName(driver, handle)); err != nil {
		t.Fatal(err)
	}

	u, err := url.Parse(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCutProxy(t, u.Host)
	leader := framework.StartControllerT(t, framework.ControllerOptions{
		Binary:     binary,
		Kubeconfig: kubeconfigVia(t, proxy),
		Args:       append([]string{"--secure-port", "0", "-v", "2"}, leaseFlags(lease)...),
	})
	var leaderID string
	framework.Eventually(t, 60*time.Second, func() (bool, error) {
		h, err := holder(ctx, lease)
		leaderID = h
		return h != "" && strings.Contains(leader.Output(), "Became leader"), err
	}, "the first replica leads")
	framework.Eventually(t, 60*time.Second, func() (bool, error) {
		va, err := cluster.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && va.Status.Attached, err
	}, "the leader attaches the volume")

	standby := start(t, lease)
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		return strings.Contains(standby.Output(), "Another replica leads"), nil
	}, "the standby sees the leader")

	// From here on, the VolumeAttachment must never be deleted.
	va, err := cluster.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := cluster.Client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + vaName, ResourceVersion: va.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var deleted sync.WaitGroup
	var wasDeleted bool
	deleted.Add(1)
	go func() {
		defer deleted.Done()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				wasDeleted = true
			}
			if o, ok := ev.Object.(interface{ GetDeletionTimestamp() *metav1.Time }); ok && o.GetDeletionTimestamp() != nil {
				wasDeleted = true
			}
		}
	}()

	cutAt := time.Now()
	proxy.Cut()
	select {
	case <-leader.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("the leader cut off from the API server did not exit within 30s")
	}
	if code := leader.Process.ExitCode(); code == 0 {
		t.Fatalf("the leader cut off from the API server exited 0, want non-zero")
	}
	t.Logf("leader exited with code %d %s after losing the API server", leader.Process.ExitCode(), time.Since(cutAt).Round(100*time.Millisecond))
	if !strings.Contains(leader.Output(), "leader election lost") {
		t.Errorf("the leader's log does not say it lost the Lease")
	}

	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		h, err := holder(ctx, lease)
		return h != "" && h != leaderID && strings.Contains(standby.Output(), "Became leader"), err
	}, "the standby takes over")
	// The new leader rebuilds its state and settles; the volume stays.
	framework.Eventually(t, 30*time.Second, func() (bool, error) {
		return strings.Contains(standby.Output(), `"Started"`), nil
	}, "the new leader starts its workers")
	framework.Consistently(t, 5*time.Second, func() error {
		va, err := cluster.Client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !va.Status.Attached || va.DeletionTimestamp != nil {
			return errDetached
		}
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, a := range n.Status.VolumesAttached {
			if a.Name == v1.UniqueVolumeName(framework.CSIVolumeName(driver, handle)) {
				return nil
			}
		}
		return errNotReported
	}, "the volume stays attached and reported across the change of leader")
	w.Stop()
	deleted.Wait()
	if wasDeleted {
		t.Fatalf("the VolumeAttachment %s was deleted during the change of leader", vaName)
	}
}

var (
	errDetached    = errors.New("the volume was detached")
	errNotReported = errors.New("the volume is missing from node.status.volumesAttached")
)
