package controller

import (
	"encoding/json"
	"net/http"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Explanation is the answer to "why is this volume (not) attached there".
type Explanation struct {
	Volume   string   `json:"volume"`
	Node     string   `json:"node"`
	Action   string   `json:"action"`
	Reason   string   `json:"reason"`
	Desired  bool     `json:"desired"`
	Pods     []string `json:"pods,omitempty"`
	State    string   `json:"state,omitempty"`
	Reported bool     `json:"reportedInNodeStatus"`
	Error    string   `json:"lastError,omitempty"`
}

// Explain says what the controller will do with a volume on a node, and why.
func (c *Controller) Explain(k cache.Key) Explanation {
	return explanation(c.reconciler.Decide(k, c.clock.Now()))
}

// ExplainPod explains every volume a pod wants.
func (c *Controller) ExplainPod(podKey string) []Explanation {
	var out []Explanation
	for _, k := range c.desired.PodKeys(podKey) {
		out = append(out, c.Explain(k))
	}
	return out
}

func explanation(d reconciler.Decision) Explanation {
	e := Explanation{Volume: string(d.Key.Volume), Node: d.Key.Node, Action: string(d.Action), Reason: d.Reason, Desired: d.Desired}
	for _, p := range d.Pods {
		e.Pods = append(e.Pods, p.String())
	}
	if d.HasAttachment {
		e.State = string(d.Attachment.State)
		e.Reported = d.Attachment.Reported
		e.Error = d.Attachment.AttachError + d.Attachment.DetachError
	}
	return e
}

// ServeHTTP answers /explain?pod=<namespace>/<name> or
// /explain?volume=<unique name>&node=<node> with JSON.
func (c *Controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var body any
	switch {
	case q.Get("pod") != "":
		body = c.ExplainPod(q.Get("pod"))
	case q.Get("volume") != "" && q.Get("node") != "":
		body = c.Explain(cache.Key{Volume: volume.Name(q.Get("volume")), Node: q.Get("node")})
	default:
		http.Error(w, "want ?pod=<namespace>/<name> or ?volume=<unique volume name>&node=<node>", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(body)
}
