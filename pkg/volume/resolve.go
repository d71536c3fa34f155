package volume

import (
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"
)

// Decider tells which mechanism handles an in-tree plugin's volumes on a
// node. An error means it can't be told yet; Resolve then returns a Pending
// Spec. pkg/migration's NodeView.Decide is the real one.
type Decider func(node, inTreePlugin string) (Kind, error)

// Source is what a pod asks for: a PersistentVolume (reached through a claim)
// or a volume inline in the pod. Exactly one of PV and Inline is set.
type Source struct {
	PV     *v1.PersistentVolume
	Inline *v1.Volume
	// PodNamespace is needed to translate some inline volumes (their secrets
	// live in the pod's namespace).
	PodNamespace string
}

// Resolve turns src into the Spec of the volume to attach to node.
//
// A migratable in-tree volume gets two names: its in-tree name and the name
// of its translated CSI volume. decide picks the one it is attached under on
// this node; the other becomes an alias. When decide can't tell yet, the Spec
// is Pending (not an error: the volume is real, the node is not ready to say).
//
// Errors: one wrapping ErrNotAttachable when the controller has nothing to
// do; any other error means the source is malformed or can't be translated.
func Resolve(logger klog.Logger, src Source, node string, decide Decider) (*Spec, error) {
	switch {
	case src.PV != nil && src.Inline != nil:
		return nil, fmt.Errorf("PersistentVolume %s and inline volume %s both given: resolve one at a time", src.PV.Name, src.Inline.Name)
	case src.PV == nil && src.Inline == nil:
		return nil, errors.New("neither a PersistentVolume nor an inline volume given")
	}

	if src.PV != nil && src.PV.Spec.CSI != nil {
		return resolveCSI(src.PV)
	}

	plugin, ps := sourcePlugin(src)
	if ps == nil {
		// Not an in-tree plugin's source: an error says what it is.
		_, _, err := InTreeName(src.PV, src.Inline)
		return nil, err
	}
	if plugin.Migratable() {
		return resolveMigratable(logger, plugin, ps, src, node, decide)
	}
	_, name, err := sourceName(describe(src), plugin, ps)
	if err != nil {
		return nil, err
	}
	spec := &Spec{
		Name:       name,
		Kind:       KindInTree,
		PluginName: plugin.Name,
	}
	setOrigin(spec, src)
	return spec, nil
}

// sourcePlugin finds the in-tree plugin of src and what it reads of it; nil
// when src is not an in-tree plugin's.
func sourcePlugin(src Source) (InTreePlugin, *pluginSource) {
	if src.PV != nil {
		return pvPlugin(&src.PV.Spec.PersistentVolumeSource)
	}
	return inlinePlugin(&src.Inline.VolumeSource)
}

func resolveCSI(pv *v1.PersistentVolume) (*Spec, error) {
	_, name, err := InTreeName(pv, nil)
	if err != nil {
		return nil, err
	}
	spec := &Spec{
		Name:         name,
		Kind:         KindCSI,
		PluginName:   CSIPluginName,
		Driver:       pv.Spec.CSI.Driver,
		VolumeHandle: pv.Spec.CSI.VolumeHandle,
	}
	setOrigin(spec, Source{PV: pv})
	return spec, nil
}

func resolveMigratable(logger klog.Logger, p InTreePlugin, ps *pluginSource, src Source, node string, decide Decider) (*Spec, error) {
	plugin := p.Name
	if p.NoAttach {
		// Migratable, but a file share: nothing is attached to a node.
		return nil, fmt.Errorf("%s (%s): %w", describe(src), plugin, ErrNotAttachable)
	}
	_, inTree, err := sourceName(describe(src), p, ps)
	if err != nil {
		return nil, err
	}

	tr := csitrans.New()
	var translated *v1.PersistentVolume
	if src.PV != nil {
		translated, err = tr.TranslateInTreePVToCSI(logger, src.PV)
	} else {
		translated, err = tr.TranslateInTreeInlineVolumeToCSI(logger, src.Inline, src.PodNamespace)
	}
	if err != nil {
		return nil, fmt.Errorf("translate %s (%s) to CSI: %w", describe(src), plugin, err)
	}
	csiSrc := translated.Spec.CSI
	if csiSrc == nil || csiSrc.Driver == "" || csiSrc.VolumeHandle == "" {
		return nil, fmt.Errorf("translate %s (%s) to CSI: no driver or volume handle in the result", describe(src), plugin)
	}
	csiName := CSIName(csiSrc.Driver, csiSrc.VolumeHandle)

	spec := &Spec{
		PluginName: plugin,
		// Both kinds carry the CSI identity so that the CSI alias (and its
		// VolumeAttachment) can be found whichever mechanism the node uses.
		Driver:       csiSrc.Driver,
		VolumeHandle: csiSrc.VolumeHandle,
	}
	setOrigin(spec, src)
	// Upstream checks multi-attach on the translated spec once migrated, and
	// translation can narrow access modes (an inline EBS disk becomes RWO, a
	// GCE PD RWX PV becomes RWO). Apply it whatever the node decides, so the
	// rule doesn't change from one node to another.
	spec.SingleNode = spec.SingleNode || singleNodeModes(translated.Spec.AccessModes)

	if decide == nil {
		return nil, fmt.Errorf("%s (%s) is migratable but no Decider was given", describe(src), plugin)
	}
	kind, err := decide(node, plugin)
	switch {
	case err != nil:
		spec.Name, spec.Aliases = inTree, []Name{csiName}
		spec.Pending = err.Error()
		var since interface{ PendingSince() time.Time }
		if errors.As(err, &since) {
			spec.PendingSince = since.PendingSince()
		}
		logger.V(4).Info("Migration of in-tree volume undecided on node", "volume", inTree, "node", node, "reason", spec.Pending)
	case kind == KindCSI:
		spec.Name, spec.Aliases = csiName, []Name{inTree}
		spec.Kind = KindCSI
		spec.Migrated = true
		if src.Inline != nil {
			spec.InlineSpec = &translated.Spec
		}
	case kind == KindInTree:
		spec.Name, spec.Aliases = inTree, []Name{csiName}
		spec.Kind = KindInTree
	default:
		return nil, fmt.Errorf("decide mechanism of %s on node %s: unknown kind %q", plugin, node, kind)
	}
	return spec, nil
}

// setOrigin records the original source and what follows from it alone.
func setOrigin(spec *Spec, src Source) {
	p, ps := sourcePlugin(src)
	if src.PV != nil {
		spec.PV = src.PV
		spec.PVName = src.PV.Name
		spec.SingleNode = singleNodeModes(src.PV.Spec.AccessModes)
		switch {
		case src.PV.Spec.CSI != nil:
			spec.ReadOnly = src.PV.Spec.CSI.ReadOnly
		case ps != nil:
			spec.ReadOnly = ps.readOnly
		}
		return
	}
	spec.Inline = src.Inline
	if ps != nil {
		spec.SingleNode = p.SingleNodeInline
		spec.ReadOnly = ps.readOnly
	}
}

// singleNodeModes is upstream's IsMultiAttachAllowed for a PV, negated: a
// PV may attach to many nodes as soon as it lists ReadWriteMany or
// ReadOnlyMany (whatever else it lists), or lists no mode at all.
func singleNodeModes(modes []v1.PersistentVolumeAccessMode) bool {
	if len(modes) == 0 {
		return false
	}
	for _, m := range modes {
		if m == v1.ReadWriteMany || m == v1.ReadOnlyMany {
			return false
		}
	}
	return true
}

func describe(src Source) string {
	if src.PV != nil {
		return "PersistentVolume " + src.PV.Name
	}
	return "volume " + src.Inline.Name
}
