package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// subject is what a `why` is about, read from the API: the pods whose
// volumes count and, for a PersistentVolume or a node, that object.
type subject struct {
	target target
	pods   []*v1.Pod
	// pv and its claim's namespace/name, for pv/NAME.
	pv    *v1.PersistentVolume
	claim string
	// names are the volume's unique names (pv/NAME), every spelling.
	names []volume.Name
	// node, for node/NAME.
	node string
}

// notKnown is what only the controller knows, said with every answer read
// from the objects.
const notKnown = `Not known without the controller: whether it wants the volume attached now
(its own reading of every pod), what it waits for (a detach elsewhere, a
node's CSINode, its retry backoff), and an attach error met before a
VolumeAttachment exists (also in the pod's FailedAttachVolume events).`

func (o *Options) why(ctx context.Context, out io.Writer, t target) error {
	c, err := o.clients()
	if err != nil {
		return err
	}
	if o.overrides.Context.Namespace == "" && t.kind == kindPod && c.namespace == "" {
		c.namespace = metav1.NamespaceDefault
	}
	w := newWorld(c.client)
	s, err := o.subject(ctx, c, w, t)
	if err != nil {
		return err
	}
	var notAsked error
	if o.ClientSide {
		notAsked = errors.New("it was not asked (--client-side)")
	} else {
		ctrl, err := o.reach(ctx, c)
		if err == nil {
			defer ctrl.close()
			var exps []explanation
			if exps, err = ctrl.ask(ctx, w, s); err == nil {
				printExplanations(out, s, ctrl.via, exps)
				return nil
			}
		}
		notAsked = err
	}
	printFromObjects(ctx, out, w, s, notAsked)
	return nil
}

// subject reads the object asked about and the pods that count.
func (o *Options) subject(ctx context.Context, c *clients, w *world, t target) (*subject, error) {
	s := &subject{target: t}
	switch t.kind {
	case kindPod:
		pod, err := c.client.CoreV1().Pods(c.namespace).Get(ctx, t.name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", c.namespace, t.name, err)
		}
		s.pods = []*v1.Pod{pod}
	case kindPV:
		pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, t.name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("PersistentVolume %s: %w", t.name, err)
		}
		s.pv = pv
		if _, name, err := volume.InTreeName(pv, nil); err == nil {
			s.names = append(s.names, name)
		}
		if spec, err := volume.Resolve(klog.Background(), volume.Source{PV: pv}, "", func(string, string) (volume.Kind, error) {
			return volume.KindCSI, nil
		}); err == nil {
			for _, n := range spec.AllNames() {
				if !slices.Contains(s.names, n) {
					s.names = append(s.names, n)
				}
			}
		}
		if ref := pv.Spec.ClaimRef; ref != nil {
			s.claim = ref.Namespace + "/" + ref.Name
			pods, err := c.client.CoreV1().Pods(ref.Namespace).List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, fmt.Errorf("pods of namespace %s: %w", ref.Namespace, err)
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				for j := range p.Spec.Volumes {
					if volume.ClaimName(p, &p.Spec.Volumes[j]) == ref.Name {
						s.pods = append(s.pods, p)
						break
					}
				}
			}
		}
	case kindNode:
		if f := w.node(ctx, t.name); f.err != nil {
			return nil, fmt.Errorf("node %s: %w", t.name, f.err)
		}
		s.node = t.name
		pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", t.name).String()})
		if err != nil {
			return nil, fmt.Errorf("pods on node %s: %w", t.name, err)
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; !podTerminated(p) && len(p.Spec.Volumes) > 0 {
				s.pods = append(s.pods, p)
			}
		}
	}
	return s, nil
}

// ask asks the controller about every pod of s and, for a volume or a node,
// about each attachment no pod accounts for.
func (c *controller) ask(ctx context.Context, w *world, s *subject) ([]explanation, error) {
	var out []explanation
	seen := map[[2]string]bool{}
	for _, p := range s.pods {
		exps, err := c.explain(ctx, url.Values{"pod": {p.Namespace + "/" + p.Name}})
		if err != nil {
			return nil, err
		}
		for _, e := range exps {
			if s.pv != nil && !s.about(p, e) {
				continue
			}
			if e.Volume != "" {
				seen[[2]string{e.Volume, e.Node}] = true
			}
			out = append(out, e)
		}
	}
	for _, k := range s.attachments(ctx, w) {
		if seen[k] {
			continue
		}
		seen[k] = true
		exps, err := c.explain(ctx, url.Values{"volume": {k[0]}, "node": {k[1]}})
		if err != nil {
			return nil, err
		}
		out = append(out, exps...)
	}
	return out, nil
}

// about says whether an answer about pod p concerns the subject's volume.
func (s *subject) about(p *v1.Pod, e explanation) bool {
	if e.Volume != "" {
		return slices.Contains(s.names, volume.Name(e.Volume))
	}
	for i := range p.Spec.Volumes {
		if p.Spec.Volumes[i].Name == e.PodVolume {
			return s.claim == p.Namespace+"/"+volume.ClaimName(p, &p.Spec.Volumes[i])
		}
	}
	return false
}

// attachments are the (volume, node) pairs the cluster shows for the
// subject: its VolumeAttachments and the node status lists.
func (s *subject) attachments(ctx context.Context, w *world) [][2]string {
	var out [][2]string
	add := func(vol, node string) {
		k := [2]string{vol, node}
		if vol != "" && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	switch {
	case s.pv != nil:
		vas, _ := w.vas(ctx)
		for _, va := range vas {
			if src := va.Spec.Source.PersistentVolumeName; src != nil && *src == s.pv.Name && len(s.names) > 0 {
				add(string(csiNameOf(s.names)), va.Spec.NodeName)
			}
		}
		nodes, err := w.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range nodes.Items {
				if n, ok := attachedListed(&nodes.Items[i], s.names); ok {
					add(string(n), nodes.Items[i].Name)
				}
			}
		}
	case s.node != "":
		if f := w.node(ctx, s.node); f.node != nil {
			for _, a := range f.node.Status.VolumesAttached {
				add(string(a.Name), s.node)
			}
		}
	}
	return out
}

// csiNameOf returns the CSI name among a volume's names, or the first.
func csiNameOf(names []volume.Name) volume.Name {
	for _, n := range names {
		if strings.HasPrefix(string(n), volume.CSIPluginName+"/") {
			return n
		}
	}
	return names[0]
}

// heading says what the answer is about.
func heading(s *subject) string {
	switch s.target.kind {
	case kindPV:
		h := "PersistentVolume " + s.pv.Name
		if s.claim != "" {
			h += " (claim " + s.claim + ")"
		}
		return h
	case kindNode:
		return "node " + s.node
	default:
		p := s.pods[0]
		if p.Spec.NodeName == "" {
			return fmt.Sprintf("pod %s/%s (not scheduled)", p.Namespace, p.Name)
		}
		return fmt.Sprintf("pod %s/%s on node %s", p.Namespace, p.Name, p.Spec.NodeName)
	}
}

// printExplanations prints the controller's answers.
func printExplanations(out io.Writer, s *subject, via string, exps []explanation) {
	fmt.Fprintf(out, "%s\nAnswered by the controller (%s).\n", heading(s), via)
	// The same for every answer: told once, first.
	for _, e := range exps {
		if e.AnotherController != "" {
			fmt.Fprintf(out, "\n  WARNING: %s\n", e.AnotherController)
			break
		}
	}
	if len(exps) == 0 {
		fmt.Fprintln(out, "\n  The controller knows of no volume of it to attach or detach.")
	}
	for _, e := range exps {
		fmt.Fprintln(out)
		switch {
		case e.Volume == "" && e.PodVolume == "":
			fmt.Fprintf(out, "  The pod: %s\n", e.Reason)
			continue
		case e.Volume == "":
			fmt.Fprintf(out, "  Volume %q of the pod: %s\n", e.PodVolume, e.Reason)
			continue
		}
		fmt.Fprintf(out, "  %s on node %s\n", e.Volume, e.Node)
		if e.PodVolume != "" {
			fmt.Fprintf(out, "    pod volume: %s\n", e.PodVolume)
		}
		state := "not attached"
		if e.State != "" {
			state = e.State
		}
		if e.Reported {
			state += ", reported in the node's status.volumesAttached"
		} else if e.State != "" {
			state += ", not reported in the node's status.volumesAttached"
		}
		fmt.Fprintf(out, "    state:  %s\n", state)
		wanted := "no pod on the node wants it"
		if e.Desired {
			wanted = "wanted by " + strings.Join(e.Pods, ", ")
		}
		fmt.Fprintf(out, "    wanted: %s\n", wanted)
		fmt.Fprintf(out, "    next:   %s\n", e.Action)
		fmt.Fprintf(out, "    why:    %s\n", e.Reason)
		if m := e.Mechanism; m != nil {
			how := m.Kind
			if m.CSIDriver != "" {
				how += " (" + m.CSIDriver + ")"
			} else if m.InTreePlugin != "" {
				how += " (" + m.InTreePlugin + ")"
			}
			if m.DecidedBy != "" {
				how += ", decided by " + m.DecidedBy
			}
			fmt.Fprintf(out, "    how:    %s\n", how)
		}
		if e.Error != "" {
			fmt.Fprintf(out, "    error:  %s\n", e.Error)
		}
		if len(e.Shadow) > 0 && string(e.Shadow) != "null" {
			fmt.Fprintf(out, "    shadow: %s\n", e.Shadow)
		}
	}
}
