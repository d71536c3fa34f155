package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// apiProxy stands between a controller under test and the kube-apiserver,
// so that a test can give the controller the view of the API that a real
// cluster gives it now and then, at a moment the test chooses: watch events
// that come late, versions a relist skips (a deletion then comes as a
// DeletedFinalStateUnknown tombstone holding the informer's last copy), the
// answer of a write that comes after the write landed, a call refused. The
// rest passes unchanged. Answers are asked for in JSON (the controller asks
// for protobuf first and accepts JSON), so that watch events can be read one
// by one.
type apiProxy struct {
	t          *testing.T
	upstream   *url.URL
	transport  *http.Transport
	reverse    *httputil.ReverseProxy
	server     *httptest.Server
	kubeconfig string
	closing    chan struct{}

	mu      sync.Mutex
	watches map[string]*resourceWatches // by resource: "nodes", "pods", ...
	rules   []*proxyRule
	// deleted are the UIDs of the VolumeAttachments whose delete, through
	// the proxy, the API accepted: the controller's deletes.
	deleted map[types.UID]string
}

// resourceWatches are the watch streams of one resource and what the test
// does to them.
type resourceWatches struct {
	held    bool
	expired bool
	// relisted is closed once the informer has listed again after expire.
	relisted chan struct{}
	streams  map[*watchStream]bool
}

type watchStream struct {
	pending []json.RawMessage
	release chan struct{} // a release of held events to write
	end     chan struct{} // closed: the stream ends, its held events dropped
}

// proxyRule acts on the requests it matches: it refuses them, or holds
// their answers, after the API acted, until released; with lose, the
// answer held is then lost, replaced by a timeout.
type proxyRule struct {
	match  func(*http.Request) bool
	refuse *metav1.Status
	hold   *answerHold
	lose   bool
	calls  int
	// late: answered at once with lostAnswer, before the API has the
	// request; the first one whose body names lateName is carried out
	// when late is released (the others never are).
	late     *lateWrite
	lateName string
}

// lateWrite is a write whose answer, a timeout, came before the write: the
// server may still carry it out, and does when released.
type lateWrite struct {
	once     sync.Once
	held     chan struct{} // closed when the write is held
	released chan struct{}
	free     sync.Once
	landed   chan struct{} // closed once the API has answered it
	status   int           // the API's answer, once landed
}

func (l *lateWrite) release() { l.free.Do(func() { close(l.released) }) }

// answerHold holds the answer of the first request of its rule.
type answerHold struct {
	once     sync.Once
	held     chan struct{} // closed when an answer is held
	released chan struct{}
	free     sync.Once
}

func (h *answerHold) release() { h.free.Do(func() { close(h.released) }) }

type ruleKey struct{}

// startAPIProxy starts a proxy to the shared cluster's kube-apiserver. It
// stops at the end of the test, after the controller using it (cleanups run
// last-in first-out).
func startAPIProxy(t *testing.T) *apiProxy {
	t.Helper()
	upstream, err := url.Parse(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	p := &apiProxy{
		t:        t,
		upstream: upstream,
		// The cluster's serving certificate is self-signed.
		transport: &http.Transport{
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a test cluster's certificate
			ForceAttemptHTTP2: true,
		},
		closing: make(chan struct{}),
		watches: map[string]*resourceWatches{},
		deleted: map[types.UID]string{},
	}
	p.reverse = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(upstream)
			r.Out.Header.Set("Accept", "application/json")
		},
		Transport:      p.transport,
		ModifyResponse: p.answered,
	}
	p.server = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.server.EnableHTTP2 = true
	p.server.StartTLS()

	config := clientcmdapi.NewConfig()
	config.Clusters["proxy"] = &clientcmdapi.Cluster{Server: p.server.URL, InsecureSkipTLSVerify: true}
	config.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cluster.Config.BearerToken}
	config.Contexts["proxy"] = &clientcmdapi.Context{Cluster: "proxy", AuthInfo: "admin"}
	config.CurrentContext = "proxy"
	p.kubeconfig = filepath.Join(t.TempDir(), "proxy.kubeconfig")
	if err := clientcmd.WriteToFile(*config, p.kubeconfig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	return p
}

func (p *apiProxy) close() {
	p.mu.Lock()
	for _, r := range p.rules {
		if r.hold != nil {
			r.hold.release()
		}
	}
	p.mu.Unlock()
	close(p.closing)
	p.server.CloseClientConnections()
	p.server.Close()
	p.transport.CloseIdleConnections()
}

func (p *apiProxy) serve(w http.ResponseWriter, r *http.Request) {
	if isWatch(r) {
		p.serveWatch(w, r)
		return
	}
	p.mu.Lock()
	var rule *proxyRule
	for _, candidate := range p.rules {
		if candidate.match(r) {
			rule = candidate
			rule.calls++
			break
		}
	}
	p.mu.Unlock()
	if rule != nil && rule.refuse != nil {
		writeStatus(w, rule.refuse)
		return
	}
	if rule != nil && rule.late != nil && p.answerBeforeWrite(w, r, rule) {
		return
	}
	if resource, rest := apiPath(r); r.Method == http.MethodGet && len(rest) == 0 {
		// A list after an expired watch is the informer's relist.
		defer p.listed(resource)
	}
	if rule != nil {
		r = r.WithContext(context.WithValue(r.Context(), ruleKey{}, rule))
	}
	p.reverse.ServeHTTP(w, r)
}

// answered sees every answer before the controller does: it records the
// VolumeAttachments the controller deleted and holds the answers a rule
// says to hold.
func (p *apiProxy) answered(resp *http.Response) error {
	req := resp.Request
	if req.Method == http.MethodDelete && resourceOf(req) == "volumeattachments" && resp.StatusCode < 300 {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		_ = resp.Body.Close() // read whole: nothing to lose
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var obj metav1.PartialObjectMetadata
		if err := json.Unmarshal(body, &obj); err == nil && obj.UID != "" {
			p.mu.Lock()
			p.deleted[obj.UID] = obj.Name
			p.mu.Unlock()
		}
	}
	if rule, ok := req.Context().Value(ruleKey{}).(*proxyRule); ok && rule.hold != nil {
		first := false
		rule.hold.once.Do(func() { first = true })
		if first {
			close(rule.hold.held)
			select {
			case <-rule.hold.released:
			case <-p.closing:
			}
			if rule.lose {
				loseAnswer(resp)
			}
		}
	}
	return nil
}

// lostAnswer is what the controller gets instead of an answer lost: the
// server's word for a request it may still have carried out.
var lostAnswer = &metav1.Status{
	TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
	Status:   metav1.StatusFailure, Code: http.StatusGatewayTimeout, Reason: metav1.StatusReasonTimeout,
	Message: "the server was unable to return a response in the time allotted, but may still be processing the request (the test lost the answer)",
}

// loseAnswer replaces the answer resp carries by lostAnswer.
func loseAnswer(resp *http.Response) {
	body, _ := json.Marshal(lostAnswer) // a Status always marshals
	_ = resp.Body.Close()               // the answer is lost
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.StatusCode, resp.Status = http.StatusGatewayTimeout, http.StatusText(http.StatusGatewayTimeout)
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Header.Set("Content-Type", "application/json")
	resp.Header.Del("Content-Encoding")
}

// answerBeforeWrite answers r with lostAnswer when its body names the
// rule's lateName (the first such request is sent to the API once
// released), and reports whether it did; other requests go on unchanged.
func (p *apiProxy) answerBeforeWrite(w http.ResponseWriter, r *http.Request, rule *proxyRule) bool {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return true
	}
	_ = r.Body.Close() // read whole
	if !bytes.Contains(body, []byte(rule.lateName)) {
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		return false
	}
	first := false
	rule.late.once.Do(func() { first = true })
	if first {
		out := r.Clone(context.Background())
		u := *p.upstream
		u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
		out.URL, out.Host, out.RequestURI = &u, u.Host, ""
		out.Header.Set("Accept", "application/json")
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		l := rule.late
		close(l.held)
		go func() {
			select {
			case <-l.released:
			case <-p.closing:
				return
			}
			resp, err := p.transport.RoundTrip(out)
			if err == nil {
				l.status = resp.StatusCode
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close() // read whole
			}
			close(l.landed)
		}()
	}
	writeStatus(w, lostAnswer.DeepCopy())
	return true
}

// landLater answers the requests match accepts whose body names name at
// once with a timeout, before the API has them: the first is sent to the
// API once released, as a server that answered a timeout and still
// carries the write out; the others never are.
func (p *apiProxy) landLater(match func(*http.Request) bool, name string) *lateWrite {
	l := &lateWrite{held: make(chan struct{}), released: make(chan struct{}), landed: make(chan struct{})}
	p.addRule(&proxyRule{match: match, late: l, lateName: name})
	return l
}

// deletedByController reports whether the VolumeAttachment with uid was
// deleted by a call through the proxy.
func (p *apiProxy) deletedByController(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.deleted[uid]
	return ok
}

// refuse makes the API refuse the requests match accepts, with a 403 as an
// admission policy would, until the returned function is called. calls
// counts the requests refused so far.
func (p *apiProxy) refuse(match func(*http.Request) bool, message string) (lift func(), calls func() int) {
	rule := &proxyRule{match: match, refuse: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: message,
	}}
	p.addRule(rule)
	return func() { p.removeRule(rule) }, func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return rule.calls
	}
}

// holdAnswer passes the first request match accepts to the API and holds
// its answer until released: the write has landed, the controller does not
// know yet.
func (p *apiProxy) holdAnswer(match func(*http.Request) bool) *answerHold {
	h := &answerHold{held: make(chan struct{}), released: make(chan struct{})}
	p.addRule(&proxyRule{match: match, hold: h})
	return h
}

// loseAnswerOf passes the first request match accepts to the API and holds
// its answer until released, then loses it: the controller gets a timeout
// for a write that landed.
func (p *apiProxy) loseAnswerOf(match func(*http.Request) bool) *answerHold {
	h := &answerHold{held: make(chan struct{}), released: make(chan struct{})}
	p.addRule(&proxyRule{match: match, hold: h, lose: true})
	return h
}

func (p *apiProxy) addRule(r *proxyRule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules = append(p.rules, r)
}

func (p *apiProxy) removeRule(r *proxyRule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, candidate := range p.rules {
		if candidate == r {
			p.rules = append(p.rules[:i], p.rules[i+1:]...)
			return
		}
	}
}

// holdEvents keeps the watch events of resource from the controller, from
// now on, until releaseEvents or expireWatches.
func (p *apiProxy) holdEvents(resource string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.watchesOf(resource).held = true
}

// expireWatches ends the watches of resource as an API server whose history
// no longer reaches their resourceVersion does ("too old resource
// version"), dropping the events held: the informers list again, and see
// the objects' current state only. The returned channel is closed once that
// list has been answered.
func (p *apiProxy) expireWatches(resource string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	rw := p.watchesOf(resource)
	rw.held = false
	rw.expired = true
	rw.relisted = make(chan struct{})
	for s := range rw.streams {
		close(s.end)
		delete(rw.streams, s)
	}
	return rw.relisted
}

func (p *apiProxy) watchesOf(resource string) *resourceWatches {
	rw := p.watches[resource]
	if rw == nil {
		rw = &resourceWatches{streams: map[*watchStream]bool{}}
		p.watches[resource] = rw
	}
	return rw
}

// listed records that the informers of resource listed it.
func (p *apiProxy) listed(resource string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rw := p.watches[resource]; rw != nil && rw.expired {
		rw.expired = false
		close(rw.relisted)
	}
}

// expiredEvent is what kube-apiserver sends on a watch from a
// resourceVersion older than its history.
var expiredEvent = json.RawMessage(`{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},` +
	`"status":"Failure","message":"too old resource version","reason":"Expired","code":410}}`)

func (p *apiProxy) serveWatch(w http.ResponseWriter, r *http.Request) {
	resource := resourceOf(r)
	// A watch that sends the initial events is the informer's list.
	initial := r.URL.Query().Get("sendInitialEvents") == "true"
	p.mu.Lock()
	rw := p.watchesOf(resource)
	expired := rw.expired && !initial
	s := &watchStream{release: make(chan struct{}, 1), end: make(chan struct{})}
	if !expired {
		rw.streams[s] = true
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(rw.streams, s)
		p.mu.Unlock()
	}()
	rc := http.NewResponseController(w)
	if expired {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(line(expiredEvent))
		_ = rc.Flush()
		return
	}

	out := r.Clone(r.Context())
	out.URL = p.upstream.ResolveReference(&url.URL{Path: r.URL.Path, RawQuery: r.URL.RawQuery})
	out.Host, out.RequestURI = "", ""
	out.Header.Set("Accept", "application/json")
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		writeStatus(w, &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadGateway, Message: err.Error()})
		return
	}
	defer func() { _ = resp.Body.Close() }() // a watch: ended by closing it
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	_ = rc.Flush()

	events := make(chan json.RawMessage)
	go func() {
		defer close(events)
		dec := json.NewDecoder(resp.Body)
		for {
			var ev json.RawMessage
			if err := dec.Decode(&ev); err != nil {
				return
			}
			select {
			case events <- ev:
			case <-r.Context().Done():
				return
			}
		}
	}()
	write := func(ev json.RawMessage) bool {
		if _, err := w.Write(line(ev)); err != nil {
			return false
		}
		if initial && endsInitialEvents(ev) {
			defer p.listed(resource)
		}
		return rc.Flush() == nil
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return
			}
			p.mu.Lock()
			hold := rw.held || len(s.pending) > 0
			if hold {
				s.pending = append(s.pending, ev)
			}
			p.mu.Unlock()
			if !hold && !write(ev) {
				return
			}
		case <-s.release:
			p.mu.Lock()
			batch := s.pending
			s.pending = nil
			p.mu.Unlock()
			for _, ev := range batch {
				if !write(ev) {
					return
				}
			}
		case <-s.end:
			_ = write(expiredEvent)
			return
		case <-r.Context().Done():
			return
		case <-p.closing:
			return
		}
	}
}

// line returns ev followed by a newline, in a new slice.
func line(ev json.RawMessage) []byte {
	return append(append(make([]byte, 0, len(ev)+1), ev...), '\n')
}

// endsInitialEvents reports whether ev is the bookmark that ends the
// initial events of a watch that lists.
func endsInitialEvents(ev json.RawMessage) bool {
	var e struct {
		Type   string                       `json:"type"`
		Object metav1.PartialObjectMetadata `json:"object"`
	}
	return json.Unmarshal(ev, &e) == nil && e.Type == "BOOKMARK" &&
		e.Object.Annotations[metav1.InitialEventsAnnotationKey] == "true"
}

func isWatch(r *http.Request) bool {
	w := r.URL.Query().Get("watch")
	return w == "true" || w == "1" || strings.Contains(r.URL.Path, "/watch/")
}

// resourceOf returns the resource a request is about: "nodes" for
// /api/v1/nodes and /api/v1/nodes/n/status, "pods" for
// /api/v1/namespaces/ns/pods, "volumeattachments" for
// /apis/storage.k8s.io/v1/volumeattachments/va.
func resourceOf(r *http.Request) string {
	resource, _ := apiPath(r)
	return resource
}

// apiPath splits a request's path into its resource and what follows it
// (the object's name and subresource; empty for the collection).
func apiPath(r *http.Request) (resource string, rest []string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) > 0 && parts[0] == "watch" {
		parts = parts[1:]
	}
	if len(parts) > 2 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	if len(parts) == 0 {
		return "", nil
	}
	return parts[0], parts[1:]
}

// isCall returns a match for requests of method on the API path p (the
// object's path, without the /api/v1 or /apis/group/version prefix), e.g.
// "nodes/n/status".
func isCall(method, p string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		if r.Method != method {
			return false
		}
		return strings.HasSuffix(path.Clean(r.URL.Path), "/"+p)
	}
}

func writeStatus(w http.ResponseWriter, s *metav1.Status) {
	s.Kind, s.APIVersion = "Status", "v1"
	body, err := json.Marshal(s)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(s.Code))
	_, _ = w.Write(body)
}

// waitClosed waits for ch to be closed, failing the test after timeout.
func waitClosed(t *testing.T, ch <-chan struct{}, timeout time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(timeout):
		t.Fatalf("%s: not after %s", what, timeout)
	case <-t.Context().Done():
		t.Fatal(errors.Join(errors.New(what), t.Context().Err()))
	}
}
