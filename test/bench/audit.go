package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"
)

// auditPolicy logs, at Metadata level, the requests of the controllers'
// users only: the harness's own traffic (setup, attacher, observer) is not
// logged. Each request is counted once, by its auditID (a watch logs both
// ResponseStarted and ResponseComplete).
func auditPolicy(users []string) string {
	var b strings.Builder
	b.WriteString("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users:\n")
	for _, u := range users {
		fmt.Fprintf(&b, "  - %q\n", u)
	}
	b.WriteString("- level: None\n")
	return b.String()
}

type auditEvent struct {
	AuditID string `json:"auditID"`
	Verb    string `json:"verb"`
	User    struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	RequestReceived time.Time `json:"requestReceivedTimestamp"`
}

// Window is a named time span requests are attributed to, by the time the
// apiserver received them. A window with Objects takes only the requests on
// objects of those names; a request counts in the first window that takes it.
type Window struct {
	Name       string
	Start, End time.Time
	Objects    map[string]bool
}

func (w Window) takes(ev auditEvent) bool {
	if ev.RequestReceived.Before(w.Start) || !ev.RequestReceived.Before(w.End) {
		return false
	}
	return w.Objects == nil || (ev.ObjectRef != nil && w.Objects[ev.ObjectRef.Name])
}

// Requests counts API requests per window and per "verb resource[/sub]".
type Requests map[string]map[string]int

// Total is the number of requests in a window.
func (r Requests) Total(window string) int {
	n := 0
	for _, c := range r[window] {
		n += c
	}
	return n
}

// Writes is the number of create, update, patch and delete requests in a
// window; with events, those on events too.
func (r Requests) Writes(window string, events bool) int {
	n := 0
	for k, c := range r[window] {
		verb, res, _ := strings.Cut(k, " ")
		if !events && res == "events" {
			continue
		}
		switch verb {
		case "create", "update", "patch", "delete", "deletecollection":
			n += c
		}
	}
	return n
}

// CountRequests reads the audit log at path and counts the requests of user
// that fall in each window; the others are ignored.
func CountRequests(path, user string, windows []Window) (Requests, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	out := Requests{}
	for _, w := range windows {
		out[w.Name] = map[string]int{}
	}
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		// Cheap filter before decoding: most lines are the other user's.
		if !strings.Contains(string(line), user) {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("decode audit event: %w", err)
		}
		if ev.User.Username != user || seen[ev.AuditID] {
			continue
		}
		seen[ev.AuditID] = true
		for _, w := range windows {
			if w.takes(ev) {
				out[w.Name][requestKind(ev)]++
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return out, nil
}

// auditTail reads the lines appended to an audit log since the last call.
type auditTail struct {
	path    string
	off     int64
	partial []byte
}

// newAuditTail starts at the current end of the log.
func newAuditTail(path string) *auditTail {
	t := &auditTail{path: path}
	if fi, err := os.Stat(path); err == nil {
		t.off = fi.Size()
	}
	return t
}

// busy reads the requests logged since the last call and says whether one
// of them is work: any request but a discovery GET (ours asks every few
// seconds whether the CSINodeInfo CRD is served, which is no work to wait
// for).
func (t *auditTail) busy() (bool, error) {
	f, err := os.Open(t.path)
	if err != nil {
		return false, fmt.Errorf("open audit log: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	busy := false
	for {
		n, err := f.ReadAt(buf, t.off)
		t.off += int64(n)
		data := append(t.partial, buf[:n]...)
		last := bytes.LastIndexByte(data, '\n')
		lines := data[:last+1]
		t.partial = append([]byte(nil), data[last+1:]...)
		for line := range bytes.SplitSeq(lines, []byte("\n")) {
			if len(line) == 0 || busy {
				continue
			}
			var ev auditEvent
			if json.Unmarshal(line, &ev) != nil || !isDiscovery(ev) {
				busy = true
			}
		}
		if err != nil || n < len(buf) {
			return busy, nil
		}
	}
}

func isDiscovery(ev auditEvent) bool {
	return ev.Verb == "get" && (ev.ObjectRef == nil || ev.ObjectRef.Resource == "")
}

// requestKind is "verb resource[/subresource]", or "verb (discovery)" for
// a non-resource request.
func requestKind(ev auditEvent) string {
	if ev.ObjectRef == nil || ev.ObjectRef.Resource == "" {
		return ev.Verb + " (discovery)"
	}
	res := ev.ObjectRef.Resource
	if ev.ObjectRef.Subresource != "" {
		res += "/" + ev.ObjectRef.Subresource
	}
	return ev.Verb + " " + res
}
