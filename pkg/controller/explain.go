package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	v1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Explanation is the answer to "why is this volume (not) attached there".
type Explanation struct {
	Volume string `json:"volume"`
	// PodVolume names the pod's volume of an answer about a volume the pod
	// wants nothing attached for; empty with Volume: about the whole pod.
	PodVolume string   `json:"podVolume,omitempty"`
	Node      string   `json:"node"`
	Action    string   `json:"action"`
	Reason    string   `json:"reason"`
	Desired   bool     `json:"desired"`
	Pods      []string `json:"pods,omitempty"`
	State     string   `json:"state,omitempty"`
	Reported  bool     `json:"reportedInNodeStatus"`
	Error     string   `json:"lastError,omitempty"`
	// Mechanism is how the volume is attached on the node, and why.
	Mechanism *Mechanism `json:"mechanism,omitempty"`
	// Shadow, in shadow mode, is what the cluster shows beside what this
	// controller would do (Action, Reason).
	Shadow *ShadowExplanation `json:"shadow,omitempty"`
	// AnotherController says that another attach/detach controller acts
	// beside this one, whatever the volume: its decisions may undo these.
	AnotherController string `json:"anotherController,omitempty"`
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
	e := c.explanation(d)
	if f, _ := c.actual.Node(k.Node); f.Exists && !f.Managed {
		if n, err := c.nodes.Get(k.Node); err == nil && managed(n) {
			if unread := c.unreadPods(k.Node); unread > 0 {
				e.Reason += fmt.Sprintf(" yet: the node turned managed, and %d of its pods are not read yet", unread)
			}
		}
	}
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

// ExplainPod explains every volume a pod wants attached and, for the pod or
// each volume of it that wants nothing attached, why not: never an empty
// answer for a pod that exists, or does not.
func (c *Controller) ExplainPod(ctx context.Context, podKey string) []Explanation {
	pod, whyNot := c.podOnManagedNode(podKey)
	if pod == nil {
		return whyNot
	}
	out := []Explanation{}
	for _, k := range c.desired.PodKeys(podKey) {
		out = append(out, c.Explain(k))
	}
	return append(out, c.explainNotWanted(ctx, pod, len(out) > 0)...)
}

// podOnManagedNode returns the pod at podKey when it is scheduled to a
// managed node and has not terminated, or else why its volumes are not
// this controller's to attach.
func (c *Controller) podOnManagedNode(podKey string) (*v1.Pod, []Explanation) {
	none := func(node, reason string, args ...any) []Explanation {
		return []Explanation{{Node: node, Action: string(reconciler.Nothing), Reason: fmt.Sprintf(reason, args...)}}
	}
	ns, name, err := toolscache.SplitMetaNamespaceKey(podKey)
	if err != nil {
		return nil, none("", "not a pod: want <namespace>/<name>")
	}
	pod, err := c.pods.Pods(ns).Get(name)
	if err != nil {
		return nil, none("", "no pod %s in the controller's cache: not created, deleted, or not listed yet", podKey)
	}
	node := pod.Spec.NodeName
	if node == "" {
		return nil, none(node, "not scheduled to a node yet")
	}
	if podTerminated(pod) {
		return nil, none(node, "terminated: the volumes of a pod that has terminated are not wanted")
	}
	n, err := c.nodes.Get(node)
	if err != nil {
		return nil, none(node, "node %s is not in the controller's cache: not created yet, or deleted", node)
	}
	if !managed(n) {
		return nil, none(node, "node %s is not managed by an attach/detach controller (no annotation %s): its kubelet attaches its volumes", node, managedAnnotation)
	}
	return pod, nil
}

// explainNotWanted says why pod, on a managed node, or a volume of it,
// wants nothing attached; wants tells whether it wants some volume attached.
func (c *Controller) explainNotWanted(ctx context.Context, pod *v1.Pod, wants bool) []Explanation {
	none := func(node, reason string, args ...any) []Explanation {
		return []Explanation{{Node: node, Action: string(reconciler.Nothing), Reason: fmt.Sprintf(reason, args...)}}
	}
	podKey, node := pod.Namespace+"/"+pod.Name, pod.Spec.NodeName
	if !wants && c.desired.Partial() {
		return none(node, "reading every pod after the controller started: this one may not be read yet")
	}
	wanted := map[string]bool{}
	for _, pv := range c.desired.PodVolumes(podKey, string(pod.UID)) {
		wanted[pv.Name] = true
	}
	var out []Explanation
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		if wanted[vol.Name] {
			continue
		}
		e := Explanation{PodVolume: vol.Name, Node: node, Action: string(reconciler.Nothing)}
		spec, err := c.podVolume(ctx, pod, vol)
		switch {
		case errors.Is(err, volume.ErrNotAttachable):
			if volume.ClaimName(pod, vol) == "" {
				continue // an emptyDir, a secret...: nothing to say
			}
			e.Reason = "nothing to attach: its plugin has no attacher, or its CSIDriver says attachRequired: false"
		case errors.Is(err, errWaiting):
			e.Action, e.Reason = string(reconciler.Wait), err.Error()
		case err != nil:
			e.Reason = "can't be resolved (see the pod's FailedAttachVolume events): " + err.Error()
		default:
			e.Volume = string(spec.Name)
			e.Reason = "resolves to this volume; the pod's last change is not read yet"
		}
		out = append(out, e)
	}
	if !wants && len(out) == 0 {
		return none(node, "none of its volumes is attached to a node (emptyDir, secrets, ...)")
	}
	return out
}

func (c *Controller) explanation(d reconciler.Decision) Explanation {
	e := Explanation{Volume: string(d.Key.Volume), Node: d.Key.Node, Action: string(d.Action), Reason: d.Reason, Desired: d.Desired}
	for _, p := range d.Pods {
		e.Pods = append(e.Pods, p.String())
	}
	if d.HasAttachment {
		e.State = string(d.Attachment.State)
		e.Reported = c.status.IsListed(d.Key)
		e.Error = d.Attachment.AttachError + d.Attachment.DetachError
	}
	return e
}

// ServeHTTP answers /explain?pod=<namespace>/<name> or
// /explain?volume=<unique name>&node=<node> with JSON.
func (c *Controller) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var another string
	if c.cfg.AnotherController != nil {
		another = c.cfg.AnotherController()
	}
	switch {
	case q.Get("pod") != "":
		list := c.ExplainPod(r.Context(), q.Get("pod"))
		for i := range list {
			list[i].AnotherController = another
		}
		writeJSON(w, list)
	case q.Get("volume") != "" && q.Get("node") != "":
		e := c.Explain(cache.Key{Volume: volume.Name(q.Get("volume")), Node: q.Get("node")})
		e.AnotherController = another
		writeJSON(w, e)
	default:
		http.Error(w, "want ?pod=<namespace>/<name> or ?volume=<unique volume name>&node=<node>", http.StatusBadRequest)
	}
}

// writeJSON answers with v as indented JSON, for people as much as tools.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
