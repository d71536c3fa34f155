package app

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// TestExplain: a pod's answer is a list, a volume's one object; a refusal
// says what the user lacks and counts as the controller not reached, so
// that the answer comes from the objects.
func TestExplain(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case r.URL.Path != "/explain":
			http.NotFound(w, r)
		case q.Get("pod") == "ns/denied":
			http.Error(w, "forbidden", http.StatusForbidden)
		case q.Get("pod") != "":
			w.Write([]byte(`[{"volume":"kubernetes.io/csi/d^h","node":"n","action":"nothing","reason":"attached","desired":true,"pods":["ns/p"],"state":"attached","reportedInNodeStatus":true}]`))
		default:
			w.Write([]byte(`{"volume":"` + q.Get("volume") + `","node":"` + q.Get("node") + `","action":"detach","reason":"no pod wants it","desired":false,"reportedInNodeStatus":true}`))
		}
	}))
	defer srv.Close()
	base, _ := url.Parse(srv.URL)
	c := &controller{base: base, client: srv.Client()}
	ctx := context.Background()

	exps, err := c.explain(ctx, url.Values{"pod": {"ns/p"}})
	if err != nil || len(exps) != 1 || exps[0].State != "attached" || !exps[0].Reported || exps[0].Pods[0] != "ns/p" {
		t.Errorf("pod: %+v, %v", exps, err)
	}
	exps, err = c.explain(ctx, url.Values{"volume": {"v"}, "node": {"n"}})
	if err != nil || len(exps) != 1 || exps[0].Action != "detach" || exps[0].Volume != "v" {
		t.Errorf("volume: %+v, %v", exps, err)
	}
	_, err = c.explain(ctx, url.Values{"pod": {"ns/denied"}})
	if !errors.Is(err, errNotReached) || !strings.Contains(err.Error(), "attach-detach-controller:explain") {
		t.Errorf("forbidden: %v, want errNotReached naming the ClusterRole", err)
	}
}
