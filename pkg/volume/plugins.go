package volume

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	csiplugins "k8s.io/csi-translation-lib/plugins"
)

// Plugin names of the in-tree sources that are never migrated to CSI; the
// migratable ones are named by k8s.io/csi-translation-lib/plugins.
const (
	ISCSIPluginName = "kubernetes.io/iscsi"
	FCPluginName    = "kubernetes.io/fc"
)

// InTreePlugin is everything the controller knows of one in-tree volume
// plugin. Adding a plugin is adding one entry to inTreePlugins.
type InTreePlugin struct {
	// Name is the plugin name, the first part of its unique volume names
	// ("kubernetes.io/aws-ebs").
	Name string
	// CSIDriver is the CSI driver its volumes migrate to; empty when they
	// never do (iSCSI, FC).
	CSIDriver string
	// MigrationCompleteUpstream: kube-controller-manager v1.37 treats the
	// plugin as migrated on every node (its csimigration.PluginManager's
	// IsMigrationCompleteForPlugin with default feature gates).
	MigrationCompleteUpstream bool
	// NoAttach: its volumes are file shares, nothing is attached to a node.
	NoAttach bool
	// SingleNodeInline: an inline volume of this plugin, which carries no
	// access modes, is attached to one node at most (upstream's rule: these
	// are known to break when attached to several nodes).
	SingleNodeInline bool

	// pv and inline read the plugin's source out of a PV or a pod volume:
	// nil when the source is not this plugin's.
	pv     func(*v1.PersistentVolumeSource) *pluginSource
	inline func(*v1.VolumeSource) *pluginSource
}

// pluginSource is what the controller reads of one plugin's volume source.
type pluginSource struct {
	// id is the plugin-specific part of the unique name, as the upstream
	// plugin's GetVolumeName returns it (kubelet computes the same).
	id       string
	readOnly bool
	// problem, when not empty, says why the source is malformed; id is then
	// not to be used.
	problem string
}

// inTreePlugins is the table of in-tree plugins, in the order their sources
// are looked for in a volume.
var inTreePlugins = []InTreePlugin{
	{
		Name: csiplugins.AWSEBSInTreePluginName, CSIDriver: csiplugins.AWSEBSDriverName, MigrationCompleteUpstream: true,
		pv:     func(s *v1.PersistentVolumeSource) *pluginSource { return ebsSource(s.AWSElasticBlockStore) },
		inline: func(s *v1.VolumeSource) *pluginSource { return ebsSource(s.AWSElasticBlockStore) },
	},
	{
		Name: csiplugins.GCEPDInTreePluginName, CSIDriver: csiplugins.GCEPDDriverName, MigrationCompleteUpstream: true,
		pv:     func(s *v1.PersistentVolumeSource) *pluginSource { return gcePDSource(s.GCEPersistentDisk) },
		inline: func(s *v1.VolumeSource) *pluginSource { return gcePDSource(s.GCEPersistentDisk) },
	},
	{
		Name: csiplugins.AzureDiskInTreePluginName, CSIDriver: csiplugins.AzureDiskDriverName, MigrationCompleteUpstream: true,
		SingleNodeInline: true,
		pv:               func(s *v1.PersistentVolumeSource) *pluginSource { return azureDiskSource(s.AzureDisk) },
		inline:           func(s *v1.VolumeSource) *pluginSource { return azureDiskSource(s.AzureDisk) },
	},
	{
		Name: csiplugins.CinderInTreePluginName, CSIDriver: csiplugins.CinderDriverName, MigrationCompleteUpstream: true,
		SingleNodeInline: true,
		pv: func(s *v1.PersistentVolumeSource) *pluginSource {
			if s.Cinder == nil {
				return nil
			}
			return idSource(csiplugins.CinderInTreePluginName, "volumeID", s.Cinder.VolumeID, s.Cinder.ReadOnly)
		},
		inline: func(s *v1.VolumeSource) *pluginSource {
			if s.Cinder == nil {
				return nil
			}
			return idSource(csiplugins.CinderInTreePluginName, "volumeID", s.Cinder.VolumeID, s.Cinder.ReadOnly)
		},
	},
	{
		Name: csiplugins.VSphereInTreePluginName, CSIDriver: csiplugins.VSphereDriverName, MigrationCompleteUpstream: true,
		pv:     func(s *v1.PersistentVolumeSource) *pluginSource { return vsphereSource(s.VsphereVolume) },
		inline: func(s *v1.VolumeSource) *pluginSource { return vsphereSource(s.VsphereVolume) },
	},
	{
		// Complete upstream since its feature gate went (v1.37).
		Name: csiplugins.PortworxVolumePluginName, CSIDriver: csiplugins.PortworxDriverName, MigrationCompleteUpstream: true,
		pv:     func(s *v1.PersistentVolumeSource) *pluginSource { return portworxSource(s.PortworxVolume) },
		inline: func(s *v1.VolumeSource) *pluginSource { return portworxSource(s.PortworxVolume) },
	},
	{
		// Attached on the node: the controller only records the attachment.
		Name: ISCSIPluginName,
		pv: func(s *v1.PersistentVolumeSource) *pluginSource {
			if s.ISCSI == nil {
				return nil
			}
			return iscsiSource(s.ISCSI.TargetPortal, s.ISCSI.IQN, s.ISCSI.Lun, s.ISCSI.ReadOnly)
		},
		inline: func(s *v1.VolumeSource) *pluginSource {
			if s.ISCSI == nil {
				return nil
			}
			return iscsiSource(s.ISCSI.TargetPortal, s.ISCSI.IQN, s.ISCSI.Lun, s.ISCSI.ReadOnly)
		},
	},
	{
		// Attached on the node: the controller only records the attachment.
		Name:   FCPluginName,
		pv:     func(s *v1.PersistentVolumeSource) *pluginSource { return fcSource(s.FC) },
		inline: func(s *v1.VolumeSource) *pluginSource { return fcSource(s.FC) },
	},
	{
		Name: csiplugins.AzureFileInTreePluginName, CSIDriver: csiplugins.AzureFileDriverName, MigrationCompleteUpstream: true,
		NoAttach: true,
		pv: func(s *v1.PersistentVolumeSource) *pluginSource {
			if s.AzureFile == nil {
				return nil
			}
			return &pluginSource{readOnly: s.AzureFile.ReadOnly}
		},
		inline: func(s *v1.VolumeSource) *pluginSource {
			if s.AzureFile == nil {
				return nil
			}
			return &pluginSource{readOnly: s.AzureFile.ReadOnly}
		},
	},
}

// InTreePlugins returns the table of in-tree plugins.
func InTreePlugins() []InTreePlugin {
	return append([]InTreePlugin(nil), inTreePlugins...)
}

// InTreePluginByName returns the entry of an in-tree plugin.
func InTreePluginByName(name string) (InTreePlugin, bool) {
	for _, p := range inTreePlugins {
		if p.Name == name {
			return p, true
		}
	}
	return InTreePlugin{}, false
}

// Migratable tells whether the plugin's volumes can be attached through a
// CSI driver.
func (p InTreePlugin) Migratable() bool { return p.CSIDriver != "" }

// pvPlugin finds the plugin of a PV's source.
func pvPlugin(s *v1.PersistentVolumeSource) (InTreePlugin, *pluginSource) {
	for _, p := range inTreePlugins {
		if src := p.pv(s); src != nil {
			return p, src
		}
	}
	return InTreePlugin{}, nil
}

// inlinePlugin finds the plugin of a pod volume's source.
func inlinePlugin(s *v1.VolumeSource) (InTreePlugin, *pluginSource) {
	for _, p := range inTreePlugins {
		if src := p.inline(s); src != nil {
			return p, src
		}
	}
	return InTreePlugin{}, nil
}

// idSource is the source of a plugin whose unique name is one field.
func idSource(plugin, field, id string, readOnly bool) *pluginSource {
	s := &pluginSource{id: id, readOnly: readOnly}
	if id == "" {
		s.problem = fmt.Sprintf("%s source has an empty %s", plugin, field)
	}
	return s
}

func ebsSource(s *v1.AWSElasticBlockStoreVolumeSource) *pluginSource {
	if s == nil {
		return nil
	}
	return idSource(csiplugins.AWSEBSInTreePluginName, "volumeID", s.VolumeID, s.ReadOnly)
}

func gcePDSource(s *v1.GCEPersistentDiskVolumeSource) *pluginSource {
	if s == nil {
		return nil
	}
	return idSource(csiplugins.GCEPDInTreePluginName, "pdName", s.PDName, s.ReadOnly)
}

func azureDiskSource(s *v1.AzureDiskVolumeSource) *pluginSource {
	if s == nil {
		return nil
	}
	return idSource(csiplugins.AzureDiskInTreePluginName, "diskURI", s.DataDiskURI, s.ReadOnly != nil && *s.ReadOnly)
}

func vsphereSource(s *v1.VsphereVirtualDiskVolumeSource) *pluginSource {
	if s == nil {
		return nil
	}
	// vsphereVolume has no readOnly field.
	return idSource(csiplugins.VSphereInTreePluginName, "volumePath", s.VolumePath, false)
}

func portworxSource(s *v1.PortworxVolumeSource) *pluginSource {
	if s == nil {
		return nil
	}
	return idSource(csiplugins.PortworxVolumePluginName, "volumeID", s.VolumeID, s.ReadOnly)
}

// iscsiSource follows the iSCSI plugin's GetVolumeName: "<portal>:<iqn>:<lun>".
func iscsiSource(portal, iqn string, lun int32, readOnly bool) *pluginSource {
	if portal == "" || iqn == "" {
		return &pluginSource{problem: fmt.Sprintf("iscsi source needs both targetPortal (%q) and iqn (%q)", portal, iqn)}
	}
	return &pluginSource{id: fmt.Sprintf("%s:%s:%d", portal, iqn, lun), readOnly: readOnly}
}

// fcSource follows the FC plugin's GetVolumeName, which formats the whole
// slice with %v: "[wwn1 wwn2]:<lun>", or "[wwid1 ...]" when only WWIDs are
// set. kubelet computes the same string, so it must not be "tidied".
func fcSource(fc *v1.FCVolumeSource) *pluginSource {
	switch {
	case fc == nil:
		return nil
	case len(fc.TargetWWNs) != 0 && fc.Lun != nil:
		return &pluginSource{id: fmt.Sprintf("%v:%d", fc.TargetWWNs, *fc.Lun), readOnly: fc.ReadOnly}
	case len(fc.WWIDs) != 0:
		return &pluginSource{id: fmt.Sprintf("%v", fc.WWIDs), readOnly: fc.ReadOnly}
	default:
		return &pluginSource{problem: "fc source needs targetWWNs with lun, or wwids"}
	}
}
