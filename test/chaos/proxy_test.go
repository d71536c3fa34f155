package chaos

import (
	"errors"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// apiProxy forwards TCP connections to kube-apiserver, for the controller's
// replicas: it can cut every connection and hold new ones for a while, so
// that the replicas' watches break and resume later, while kube-apiserver,
// the other components and the checker's watches go on undisturbed.
type apiProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]bool
	// held is closed when connections may pass again; nil when they may.
	held chan struct{}
}

// newAPIProxy starts a proxy to the apiserver of the kubeconfig at path and
// returns it with a kubeconfig that goes through it.
func newAPIProxy(t *testing.T, kubeconfig string) (*apiProxy, string) {
	config, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cluster := config.Clusters[config.Contexts[config.CurrentContext].Cluster]
	u, err := url.Parse(cluster.Server)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{ln: ln, target: u.Host, conns: map[net.Conn]bool{}}
	t.Cleanup(p.close)
	go p.serve()
	cluster.Server = "https://" + ln.Addr().String()
	path := filepath.Join(t.TempDir(), "through-proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*config, path); err != nil {
		t.Fatal(err)
	}
	return p, path
}

func (p *apiProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		go p.forward(c)
	}
}

// forward waits while connections are held (the client waits in its TLS
// handshake, as behind a partition), then pipes c to the apiserver.
func (p *apiProxy) forward(c net.Conn) {
	p.mu.Lock()
	held := p.held
	p.mu.Unlock()
	if held != nil {
		<-held
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		_ = c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src) // ends when either side closes
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	p.untrack(c, up)
}

// track records a live pair of connections, or closes them when the proxy
// holds connections again (cut while this one was dialling).
func (p *apiProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil || p.conns == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.conns[c] = true
	}
	return true
}

func (p *apiProxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// cut closes every connection and holds new ones until resume.
func (p *apiProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held == nil {
		p.held = make(chan struct{})
	}
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// resume lets the held connections through.
func (p *apiProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held != nil {
		close(p.held)
		p.held = nil
	}
}

func (p *apiProxy) close() {
	_ = p.ln.Close()
	p.resume()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
