package app

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// printFromObjects prints the answer read from the objects, when the
// controller was not asked (notAsked says why).
func printFromObjects(ctx context.Context, out io.Writer, w *world, s *subject, notAsked error) {
	fmt.Fprintf(out, "%s\nAnswered from the objects, not by the controller: %v.\n", heading(s), notAsked)
	switch s.target.kind {
	case kindNode:
		printNode(ctx, out, w, s)
	case kindPV:
		printPV(ctx, out, w, s)
	}
	for _, p := range s.pods {
		printPod(ctx, out, w, s, p)
	}
	fmt.Fprintf(out, "\n%s\n", notKnown)
}

// printPod follows each volume of p down the chain.
func printPod(ctx context.Context, out io.Writer, w *world, s *subject, p *v1.Pod) {
	if s.target.kind != kindPod {
		fmt.Fprintf(out, "\n  pod %s/%s:\n", p.Namespace, p.Name)
	}
	node := p.Spec.NodeName
	switch {
	case node == "":
		fmt.Fprintln(out, "\n  Not scheduled to a node yet: nothing is attached before it is.")
		return
	case podTerminated(p):
		fmt.Fprintln(out, "\n  Terminated: the volumes of a pod that has terminated are not wanted.")
		return
	}
	nf := w.node(ctx, node)
	switch {
	case nf.err != nil:
		fmt.Fprintf(out, "\n  Node %s: %v: nothing is attached to a node that does not exist.\n", node, nf.err)
		return
	case !managed(nf.node):
		fmt.Fprintf(out, "\n  Node %s is not managed by an attach/detach controller (no annotation %s): its kubelet attaches its volumes.\n", node, managedAnnotation)
		return
	case !nodeReady(nf.node):
		fmt.Fprintf(out, "\n  Node %s is not Ready: nothing is detached from it while a volume is in use, unless it stays so past the max wait for unmount or is tainted out-of-service.\n", node)
	}
	vols := w.podVolumes(ctx, p)
	if len(vols) == 0 {
		fmt.Fprintln(out, "\n  None of its volumes is attached to a node (emptyDir, secrets, ...).")
	}
	for _, f := range vols {
		if s.target.kind == kindPV && s.claim != p.Namespace+"/"+f.claim {
			continue
		}
		printPodVolume(ctx, out, w, nf, f)
	}
}

func printPodVolume(ctx context.Context, out io.Writer, w *world, nf *nodeFacts, f podVolumeFacts) {
	chain := fmt.Sprintf("volume %q", f.name)
	if f.claim != "" {
		chain += fmt.Sprintf(": claim %s", f.claim)
	}
	if f.pv != nil {
		chain += " -> PersistentVolume " + f.pv.Name
	}
	if f.spec != nil {
		chain += " -> " + string(f.spec.Name)
		var what []string
		if f.spec.Migrated {
			what = append(what, "migrated to CSI")
		}
		if f.spec.SingleNode {
			what = append(what, "single-node")
		}
		if len(what) > 0 {
			chain += " (" + strings.Join(what, ", ") + ")"
		}
	}
	fmt.Fprintf(out, "\n  %s\n", chain)
	switch {
	case f.notFound != "":
		fmt.Fprintf(out, "    => %s\n", f.notFound)
		return
	case f.skip:
		fmt.Fprintln(out, "    => nothing to attach: its plugin has no attacher, or its CSIDriver says attachRequired: false")
		return
	case f.spec.Pending != "":
		fmt.Fprintf(out, "    => undecided on node %s: %s\n", nf.name, f.spec.Pending)
		return
	}
	names := f.spec.AllNames()
	node := nf.node
	listedAs, listed := attachedListed(node, names)
	inUse := inUseListed(node, names)
	if f.spec.Kind == volume.KindCSI {
		printCSINode(out, nf, f.spec.Driver)
		vas, err := w.vas(ctx)
		if err != nil {
			fmt.Fprintf(out, "    VolumeAttachments: %v\n", err)
		}
		var here *storagev1.VolumeAttachment
		var elsewhere []string
		for _, va := range attachmentsOf(vas, f.spec) {
			fmt.Fprintf(out, "    VolumeAttachment %s on node %s: %s\n", va.Name, va.Spec.NodeName, vaState(&va))
			if va.Spec.NodeName == node.Name {
				here = &va
			} else if va.Status.Attached || va.DeletionTimestamp != nil {
				elsewhere = append(elsewhere, va.Spec.NodeName)
			}
		}
		printStatus(out, node.Name, listedAs, listed, inUse)
		switch {
		case here == nil && f.spec.SingleNode && len(elsewhere) > 0:
			fmt.Fprintf(out, "    => waits: a single-node volume still attached to node %s; it is attached here once detached there (after its kubelet unmounts it: that node's status.volumesInUse)\n", strings.Join(elsewhere, ", "))
		case here == nil:
			fmt.Fprintf(out, "    => no VolumeAttachment on node %s: the controller has not created it (not running, not leading, or waiting: ask it)\n", node.Name)
		case here.DeletionTimestamp != nil:
			fmt.Fprintln(out, "    => being detached (its VolumeAttachment is deleted); attached again once gone, if still wanted")
		case here.Status.AttachError != nil && !here.Status.Attached:
			fmt.Fprintf(out, "    => the driver failed to attach it: %s (retried with backoff)\n", here.Status.AttachError.Message)
		case !here.Status.Attached:
			fmt.Fprintf(out, "    => waiting for the external-attacher of %s to attach it (no status yet: is it running and leading?)\n", f.spec.Driver)
		case !listed:
			fmt.Fprintf(out, "    => attached, not yet in node %s's status.volumesAttached: kubelet waits to see it there before mounting\n", node.Name)
		case !inUse:
			fmt.Fprintln(out, "    => attached and reported: kubelet can mount it (not mounted yet)")
		default:
			fmt.Fprintln(out, "    => attached, reported and mounted")
		}
		return
	}
	printStatus(out, node.Name, listedAs, listed, inUse)
	if listed {
		fmt.Fprintln(out, "    => attached by its in-tree plugin and reported")
	} else {
		fmt.Fprintf(out, "    => not in node %s's status.volumesAttached: not attached yet (an in-tree attach error is only in the pod's events and the controller's /explain)\n", node.Name)
	}
}

func printCSINode(out io.Writer, nf *nodeFacts, driver string) {
	switch {
	case nf.csiErr != nil:
		fmt.Fprintf(out, "    CSINode %s: %v (kubelet writes it when it starts)\n", nf.name, nf.csiErr)
	case !slices.ContainsFunc(nf.csiNode.Spec.Drivers, func(d storagev1.CSINodeDriver) bool { return d.Name == driver }):
		fmt.Fprintf(out, "    CSINode %s does not list driver %s: its node plugin is not registered there, kubelet can't mount the volume\n", nf.name, driver)
	default:
		fmt.Fprintf(out, "    CSINode %s lists driver %s\n", nf.name, driver)
	}
}

func printStatus(out io.Writer, node string, listedAs volume.Name, listed, inUse bool) {
	var parts []string
	if listed {
		parts = append(parts, "in status.volumesAttached as "+string(listedAs))
	} else {
		parts = append(parts, "not in status.volumesAttached")
	}
	if inUse {
		parts = append(parts, "in status.volumesInUse (mounted)")
	} else {
		parts = append(parts, "not in status.volumesInUse")
	}
	fmt.Fprintf(out, "    node %s: %s\n", node, strings.Join(parts, "; "))
}

func vaState(va *storagev1.VolumeAttachment) string {
	var s []string
	switch {
	case va.DeletionTimestamp != nil:
		s = append(s, "being deleted (detaching)")
	case va.Status.Attached:
		s = append(s, "attached")
	case va.Status.AttachError != nil:
		s = append(s, "not attached")
	default:
		s = append(s, "not attached yet")
	}
	if e := va.Status.AttachError; e != nil {
		s = append(s, "attach error: "+e.Message)
	}
	if e := va.Status.DetachError; e != nil {
		s = append(s, "detach error: "+e.Message)
	}
	return strings.Join(s, "; ")
}

func managed(node *v1.Node) bool {
	_, ok := node.Annotations[managedAnnotation]
	return ok
}

// printNode prints the node's own facts and the attachments no pod on it
// accounts for.
func printNode(ctx context.Context, out io.Writer, w *world, s *subject) {
	nf := w.node(ctx, s.node)
	n := nf.node
	fmt.Fprintf(out, "\n  Ready: %t; managed (annotation %s): %t\n", nodeReady(n), managedAnnotation, managed(n))
	for _, t := range n.Spec.Taints {
		if t.Key == v1.TaintNodeOutOfService {
			fmt.Fprintf(out, "  Tainted %s: its volumes are detached at once, mounted or not\n", t.Key)
		}
	}
	if nf.csiErr != nil {
		fmt.Fprintf(out, "  CSINode: %v\n", nf.csiErr)
	} else {
		var drivers []string
		for _, d := range nf.csiNode.Spec.Drivers {
			drivers = append(drivers, d.Name)
		}
		fmt.Fprintf(out, "  CSINode drivers: %s; migrated plugins: %s\n", orNone(drivers), orNone(strings.Split(nf.csiNode.Annotations[migratedAnnotation], ",")))
	}
	wanted := map[volume.Name]bool{}
	for _, p := range s.pods {
		for _, f := range w.podVolumes(ctx, p) {
			if f.spec != nil {
				for _, name := range f.spec.AllNames() {
					wanted[name] = true
				}
			}
		}
	}
	inUse := map[string]bool{}
	for _, name := range n.Status.VolumesInUse {
		inUse[string(name)] = true
	}
	fmt.Fprintf(out, "  status.volumesAttached: %d, status.volumesInUse: %d\n", len(n.Status.VolumesAttached), len(n.Status.VolumesInUse))
	for _, a := range n.Status.VolumesAttached {
		if wanted[volume.Name(a.Name)] {
			continue
		}
		mounted := "not in use: the controller detaches it"
		if inUse[string(a.Name)] {
			mounted = "still in volumesInUse: detached once kubelet unmounts it"
		}
		fmt.Fprintf(out, "  %s: attached, no pod on the node wants it; %s\n", a.Name, mounted)
	}
	vas, err := w.vas(ctx)
	if err != nil {
		fmt.Fprintf(out, "  VolumeAttachments: %v\n", err)
	}
	for _, va := range vas {
		if va.Spec.NodeName == s.node && (va.Status.AttachError != nil || va.Status.DetachError != nil || va.DeletionTimestamp != nil) {
			fmt.Fprintf(out, "  VolumeAttachment %s: %s\n", va.Name, vaState(&va))
		}
	}
	if len(s.pods) == 0 {
		fmt.Fprintln(out, "  No running pod on the node has volumes.")
	}
}

// printPV prints the volume's own facts and where the cluster shows it
// attached.
func printPV(ctx context.Context, out io.Writer, w *world, s *subject) {
	pv := s.pv
	fmt.Fprintf(out, "\n  phase %s; access modes %v; names %v\n", pv.Status.Phase, pv.Spec.AccessModes, s.names)
	if s.claim == "" {
		fmt.Fprintln(out, "  Not claimed: no pod can use it, nothing attaches it.")
	} else if len(s.pods) == 0 {
		fmt.Fprintf(out, "  No pod uses claim %s: nothing wants it attached.\n", s.claim)
	}
	vas, err := w.vas(ctx)
	if err != nil {
		fmt.Fprintf(out, "  VolumeAttachments: %v\n", err)
	}
	for _, va := range vas {
		if src := va.Spec.Source.PersistentVolumeName; src != nil && *src == pv.Name {
			fmt.Fprintf(out, "  VolumeAttachment %s on node %s: %s\n", va.Name, va.Spec.NodeName, vaState(&va))
		}
	}
	for _, k := range s.attachments(ctx, w) {
		nf := w.node(ctx, k[1])
		if nf.node != nil {
			_, listed := attachedListed(nf.node, s.names)
			fmt.Fprintf(out, "  node %s: in status.volumesAttached: %t; in status.volumesInUse: %t\n", k[1], listed, inUseListed(nf.node, s.names))
		}
	}
}

func orNone(s []string) string {
	s = slices.DeleteFunc(s, func(x string) bool { return x == "" })
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}
