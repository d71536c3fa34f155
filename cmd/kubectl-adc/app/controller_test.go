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

// The controller's word that another attach/detach controller acts beside
// it is printed once, before the answers; nothing when it says nothing.
func TestPrintAnotherController(t *testing.T) {
	s := &subject{target: target{kindNode, "n"}, node: "n"}
	exps := []explanation{
		{Volume: "kubernetes.io/csi/d^a", Node: "n", Action: "nothing", Reason: "attached"},
		{Volume: "kubernetes.io/csi/d^b", Node: "n", Action: "nothing", Reason: "attached"},
	}
	var out strings.Builder
	printExplanations(&out, s, "test", exps)
	if strings.Contains(out.String(), "WARNING") {
		t.Errorf("a warning with none given:\n%s", out.String())
	}
	for i := range exps {
		exps[i].AnotherController = "another attach/detach controller acts beside this one: field manager \"kube-controller-manager\""
	}
	out.Reset()
	printExplanations(&out, s, "test", exps)
	if got := strings.Count(out.String(), "WARNING: another attach/detach controller acts beside this one"); got != 1 ||
		strings.Index(out.String(), "WARNING") > strings.Index(out.String(), "kubernetes.io/csi/d^a") {
		t.Errorf("want the warning once, before the answers:\n%s", out.String())
	}
}
