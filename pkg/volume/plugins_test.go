package volume

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2/ktesting"
)

// The table and csi-translation-lib, which translates the specs, must agree
// on which plugins migrate and to which driver.
func TestInTreePluginsAgreeWithTranslationLib(t *testing.T) {
	tr := csitrans.New()
	seen := map[string]bool{}
	for _, p := range InTreePlugins() {
		if seen[p.Name] {
			t.Errorf("plugin %s is in the table twice", p.Name)
		}
		seen[p.Name] = true
		if p.pv == nil || p.inline == nil {
			t.Errorf("plugin %s: both source readers must be set", p.Name)
		}
		if got := tr.IsMigratableIntreePluginByName(p.Name); got != p.Migratable() {
			t.Errorf("plugin %s: migratable %v in the table, %v in csi-translation-lib", p.Name, p.Migratable(), got)
		}
		if !p.Migratable() {
			if p.MigrationCompleteUpstream {
				t.Errorf("plugin %s: complete upstream but not migratable", p.Name)
			}
			continue
		}
		driver, err := tr.GetCSINameFromInTreeName(p.Name)
		if err != nil || driver != p.CSIDriver {
			t.Errorf("plugin %s: driver %q in the table, csi-translation-lib says (%q, %v)", p.Name, p.CSIDriver, driver, err)
		}
		back, err := tr.GetInTreeNameFromCSIName(p.CSIDriver)
		if err != nil || back != p.Name {
			t.Errorf("driver %s: csi-translation-lib maps it back to (%q, %v), want %s", p.CSIDriver, back, err, p.Name)
		}
	}
	for _, name := range []string{"kubernetes.io/aws-ebs", "kubernetes.io/gce-pd", "kubernetes.io/azure-disk", "kubernetes.io/azure-file",
		"kubernetes.io/cinder", "kubernetes.io/vsphere-volume", "kubernetes.io/portworx-volume", ISCSIPluginName, FCPluginName} {
		if _, ok := InTreePluginByName(name); !ok {
			t.Errorf("InTreePluginByName(%s) not found", name)
		}
	}
	if _, ok := InTreePluginByName("kubernetes.io/rbd"); ok {
		t.Errorf("InTreePluginByName(kubernetes.io/rbd) found a plugin this controller does not know")
	}
}

// ReadOnly and the inline single-node rule come from the plugin's entry.
func TestResolveReadOnlyAndSingleNode(t *testing.T) {
	yes := true
	tests := []struct {
		name           string
		pv             v1.PersistentVolumeSource
		inline         v1.VolumeSource
		wantReadOnly   bool
		wantSingleNode bool // inline only
	}{
		{name: "ebs", pv: v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1", ReadOnly: true}},
			inline: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1", ReadOnly: true}}, wantReadOnly: true},
		{name: "gce", pv: v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "d", ReadOnly: true}},
			inline: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "d", ReadOnly: true}}, wantReadOnly: true},
		{name: "azure disk", pv: v1.PersistentVolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "u", ReadOnly: &yes}},
			inline: v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "u", ReadOnly: &yes}}, wantReadOnly: true, wantSingleNode: true},
		{name: "azure disk read-write", pv: v1.PersistentVolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "u"}},
			inline: v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "u"}}, wantSingleNode: true},
		{name: "cinder", pv: v1.PersistentVolumeSource{Cinder: &v1.CinderPersistentVolumeSource{VolumeID: "c", ReadOnly: true}},
			inline: v1.VolumeSource{Cinder: &v1.CinderVolumeSource{VolumeID: "c", ReadOnly: true}}, wantReadOnly: true, wantSingleNode: true},
		{name: "vsphere has no read-only field", pv: v1.PersistentVolumeSource{VsphereVolume: &v1.VsphereVirtualDiskVolumeSource{VolumePath: "[ds] v.vmdk"}},
			inline: v1.VolumeSource{VsphereVolume: &v1.VsphereVirtualDiskVolumeSource{VolumePath: "[ds] v.vmdk"}}},
		{name: "portworx", pv: v1.PersistentVolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "p", ReadOnly: true}},
			inline: v1.VolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "p", ReadOnly: true}}, wantReadOnly: true},
		{name: "iscsi", pv: v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "p", IQN: "i", ReadOnly: true}},
			inline: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "p", IQN: "i", ReadOnly: true}}, wantReadOnly: true},
		{name: "fc", pv: v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"w"}, ReadOnly: true}},
			inline: v1.VolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"w"}, ReadOnly: true}}, wantReadOnly: true},
	}
	decide := func(string, string) (Kind, error) { return KindInTree, nil }
	logger, _ := ktesting.NewTestContext(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, err := Resolve(logger, Source{PV: pvWith(tc.pv)}, "node-1", decide)
			if err != nil {
				t.Fatalf("Resolve PV: %v", err)
			}
			if spec.ReadOnly != tc.wantReadOnly {
				t.Errorf("PV: ReadOnly %v, want %v", spec.ReadOnly, tc.wantReadOnly)
			}
			spec, err = Resolve(logger, Source{Inline: inlineWith(tc.inline), PodNamespace: "ns"}, "node-1", decide)
			if err != nil {
				t.Fatalf("Resolve inline: %v", err)
			}
			if spec.ReadOnly != tc.wantReadOnly {
				t.Errorf("inline: ReadOnly %v, want %v", spec.ReadOnly, tc.wantReadOnly)
			}
			// Translation may narrow a migratable volume further (resolve_test).
			if tc.wantSingleNode && !spec.SingleNode {
				t.Errorf("inline: SingleNode false, want true")
			}
			if p, _ := inlinePlugin(&tc.inline); p.SingleNodeInline != tc.wantSingleNode {
				t.Errorf("%s: SingleNodeInline %v, want %v", p.Name, p.SingleNodeInline, tc.wantSingleNode)
			}
		})
	}
}
