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
	// Mechanism is how the volume is attached on the node, and why.
	Mechanism *Mechanism `json:"mechanism,omitempty"`
	// Shadow, in shadow mode, is what the cluster shows beside what this
	// controller would do (Action, Reason).
	Shadow *ShadowExplanation `json:"shadow,omitempty"`
}

// Mechanism says which mechanism attaches a volume on a node (a CSI driver
// through a VolumeAttachment, or an in-tree plugin) and which object or rule
// chose it.
type Mechanism struct {
	// Kind is "csi" or "in-tree"; empty while undecided.
	Kind         string `json:"kind"`
	CSIDriver    string `json:"csiDriver,omitempty"`
	InTreePlugin string `json:"inTreePlugin,omitempty"`
	DecidedBy    string `json:"decidedBy"`
}

// Explain says what the controller will do with a volume on a node, and why.
func (c *Controller) Explain(k cache.Key) Explanation {
	d := c.reconciler.Decide(k, c.clock.Now())
	e := explanation(d)
	e.Mechanism = c.mechanism(d)
	e.Shadow = c.explainShadow(d)
	return e
}

// mechanism explains the mechanism of the volume a pod wants, or of the
// attachment no pod wants any more.
func (c *Controller) mechanism(d reconciler.Decision) *Mechanism {
	s := d.Spec
	if s == nil {
		if !d.HasAttachment {
			return nil
		}
		m := &Mechanism{Kind: string(d.Attachment.Kind), DecidedBy: "the existing attachment (no pod wants the volume)"}
		if d.Attachment.Kind == volume.KindCSI {
			_, m.CSIDriver, _ = volume.Parse(d.Key.Volume)
		} else {
			m.InTreePlugin = d.Attachment.PluginName
		}
		return m
	}
	m := &Mechanism{Kind: string(s.Kind)}
	if s.PluginName != volume.CSIPluginName {
		m.InTreePlugin = s.PluginName
	}
	if s.Kind == volume.KindCSI {
		m.CSIDriver = s.Driver
	}
	switch {
	case s.PluginName == volume.CSIPluginName:
		m.DecidedBy = "PersistentVolume " + s.PVName + " (a CSI volume)"
	case s.Pending != "":
		m.DecidedBy = "undecided: " + s.Pending
	default:
		// Read again now: what the pod's last sync read, unless the
		// objects changed since (their change re-queues the pod).
		dec, err := c.nodeView.Decision(d.Key.Node, s.PluginName)
		m.DecidedBy = dec.Origin(d.Key.Node)
		if err != nil {
			m.DecidedBy += ": " + err.Error()
		}
	}
	return m
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
	writeJSON(w, body)
}

// writeJSON answers with v as indented JSON, for people as much as tools.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
