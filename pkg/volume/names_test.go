package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCSIName(t *testing.T) {
	got := CSIName("ebs.csi.aws.com", "vol-abc")
	if want := Name("kubernetes.io/csi/ebs.csi.aws.com^vol-abc"); got != want {
		t.Errorf("CSIName = %q, want %q", got, want)
	}
}

func TestAttachmentName(t *testing.T) {
	tests := []struct {
		name                 string
		handle, driver, node string
		want                 string
	}{
		{
			// Literal computed outside Go: printf '%s' 'vol-abcebs.csi.aws.comnode-1' | sha256sum
			name:   "literal",
			handle: "vol-abc", driver: "ebs.csi.aws.com", node: "node-1",
			want: "csi-99029d819df9c43010710fe16b66bc6a93e00d47e08e1bd7d17f817b9e4fab7f",
		},
		{
			name:   "handle with slashes",
			handle: "projects/p/zones/z/disks/d1", driver: "pd.csi.storage.gke.io", node: "www",
			want: "csi-fd2e63bfff52385e4240f66eec219b5173b3a4e4ab37db7156a0e055e0cd3a39",
		},
		{
			name:   "plain concatenation, no separator",
			handle: "a", driver: "bc", node: "d",
			want: "csi-" + sha256Hex("abcd"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := AttachmentName(tc.handle, tc.driver, tc.node); got != tc.want {
				t.Errorf("AttachmentName(%q, %q, %q) = %q, want %q", tc.handle, tc.driver, tc.node, got, tc.want)
			}
		})
	}
	if AttachmentName("a", "b", "c") == AttachmentName("c", "b", "a") {
		t.Errorf("argument order must matter")
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func pvWith(src v1.PersistentVolumeSource, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1"},
		Spec:       v1.PersistentVolumeSpec{PersistentVolumeSource: src, AccessModes: modes},
	}
}

func inlineWith(src v1.VolumeSource) *v1.Volume {
	return &v1.Volume{Name: "vol-1", VolumeSource: src}
}

func lun(n int32) *int32 { return &n }

func TestInTreeName(t *testing.T) {
	iscsi := v1.ISCSIVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", Lun: 0}
	tests := []struct {
		name       string
		pv         *v1.PersistentVolume
		inline     *v1.Volume
		wantPlugin string
		want       Name
		wantNotAtt bool   // error wraps ErrNotAttachable
		wantErr    string // other error, by substring
	}{
		// Attachable in-tree sources, PV and inline.
		{name: "ebs pv", pv: pvWith(v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-abc"}}),
			wantPlugin: "kubernetes.io/aws-ebs", want: "kubernetes.io/aws-ebs/vol-abc"},
		{name: "ebs inline with zone url", inline: inlineWith(v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-abc"}}),
			wantPlugin: "kubernetes.io/aws-ebs", want: "kubernetes.io/aws-ebs/aws://us-east-1a/vol-abc"},
		{name: "gce pd pv", pv: pvWith(v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}}),
			wantPlugin: "kubernetes.io/gce-pd", want: "kubernetes.io/gce-pd/disk-1"},
		{name: "gce pd inline", inline: inlineWith(v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}}),
			wantPlugin: "kubernetes.io/gce-pd", want: "kubernetes.io/gce-pd/disk-1"},
		{name: "azure disk pv", pv: pvWith(v1.PersistentVolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d1", DataDiskURI: "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d1"}}),
			wantPlugin: "kubernetes.io/azure-disk", want: "kubernetes.io/azure-disk//subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d1"},
		{name: "azure disk inline", inline: inlineWith(v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DataDiskURI: "uri-1"}}),
			wantPlugin: "kubernetes.io/azure-disk", want: "kubernetes.io/azure-disk/uri-1"},
		{name: "cinder pv", pv: pvWith(v1.PersistentVolumeSource{Cinder: &v1.CinderPersistentVolumeSource{VolumeID: "c-1"}}),
			wantPlugin: "kubernetes.io/cinder", want: "kubernetes.io/cinder/c-1"},
		{name: "cinder inline", inline: inlineWith(v1.VolumeSource{Cinder: &v1.CinderVolumeSource{VolumeID: "c-1"}}),
			wantPlugin: "kubernetes.io/cinder", want: "kubernetes.io/cinder/c-1"},
		{name: "vsphere pv", pv: pvWith(v1.PersistentVolumeSource{VsphereVolume: &v1.VsphereVirtualDiskVolumeSource{VolumePath: "[ds1] vols/v1.vmdk"}}),
			wantPlugin: "kubernetes.io/vsphere-volume", want: "kubernetes.io/vsphere-volume/[ds1] vols/v1.vmdk"},
		{name: "vsphere inline", inline: inlineWith(v1.VolumeSource{VsphereVolume: &v1.VsphereVirtualDiskVolumeSource{VolumePath: "[ds1] v.vmdk"}}),
			wantPlugin: "kubernetes.io/vsphere-volume", want: "kubernetes.io/vsphere-volume/[ds1] v.vmdk"},
		{name: "portworx pv", pv: pvWith(v1.PersistentVolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "px-1"}}),
			wantPlugin: "kubernetes.io/portworx-volume", want: "kubernetes.io/portworx-volume/px-1"},
		{name: "portworx inline", inline: inlineWith(v1.VolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "px-1"}}),
			wantPlugin: "kubernetes.io/portworx-volume", want: "kubernetes.io/portworx-volume/px-1"},
		{name: "iscsi pv", pv: pvWith(v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: iscsi.TargetPortal, IQN: iscsi.IQN}}),
			wantPlugin: "kubernetes.io/iscsi", want: "kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0"},
		{name: "iscsi inline lun 3", inline: inlineWith(v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.x", Lun: 3}}),
			wantPlugin: "kubernetes.io/iscsi", want: "kubernetes.io/iscsi/10.0.0.1:3260:iqn.x:3"},
		// FC: upstream formats the whole slice with %v.
		{name: "fc wwn+lun", pv: pvWith(v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0981891b8dc5"}, Lun: lun(1)}}),
			wantPlugin: "kubernetes.io/fc", want: "kubernetes.io/fc/[500a0981891b8dc5]:1"},
		{name: "fc two wwns", inline: inlineWith(v1.VolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"w1", "w2"}, Lun: lun(0)}}),
			wantPlugin: "kubernetes.io/fc", want: "kubernetes.io/fc/[w1 w2]:0"},
		{name: "fc wwids only", inline: inlineWith(v1.VolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"3600508b400105e210000900000490000"}}}),
			wantPlugin: "kubernetes.io/fc", want: "kubernetes.io/fc/[3600508b400105e210000900000490000]"},
		{name: "fc wwns without lun falls back to wwids", pv: pvWith(v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"w1"}, WWIDs: []string{"id1"}}}),
			wantPlugin: "kubernetes.io/fc", want: "kubernetes.io/fc/[id1]"},
		// CSI PV.
		{name: "csi pv", pv: pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}),
			wantPlugin: CSIPluginName, want: "kubernetes.io/csi/d.example.com^h1"},

		// Not attachable.
		{name: "nfs pv", pv: pvWith(v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}}), wantNotAtt: true},
		{name: "local pv", pv: pvWith(v1.PersistentVolumeSource{Local: &v1.LocalVolumeSource{Path: "/mnt"}}), wantNotAtt: true},
		{name: "hostPath pv", pv: pvWith(v1.PersistentVolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/tmp"}}), wantNotAtt: true},
		{name: "azure file pv", pv: pvWith(v1.PersistentVolumeSource{AzureFile: &v1.AzureFilePersistentVolumeSource{ShareName: "s"}}), wantNotAtt: true},
		{name: "azure file inline", inline: inlineWith(v1.VolumeSource{AzureFile: &v1.AzureFileVolumeSource{ShareName: "s"}}), wantNotAtt: true},
		{name: "configMap", inline: inlineWith(v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}), wantNotAtt: true},
		{name: "emptyDir", inline: inlineWith(v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}), wantNotAtt: true},
		{name: "secret", inline: inlineWith(v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}), wantNotAtt: true},
		{name: "projected", inline: inlineWith(v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{}}), wantNotAtt: true},
		{name: "inline csi", inline: inlineWith(v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "d"}}), wantNotAtt: true},

		// Malformed.
		{name: "ebs empty id", pv: pvWith(v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{}}), wantErr: "empty volumeID"},
		{name: "gce empty pdName", inline: inlineWith(v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{}}), wantErr: "empty pdName"},
		{name: "azure disk empty uri", pv: pvWith(v1.PersistentVolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d"}}), wantErr: "empty diskURI"},
		{name: "cinder empty id", inline: inlineWith(v1.VolumeSource{Cinder: &v1.CinderVolumeSource{}}), wantErr: "empty volumeID"},
		{name: "vsphere empty path", pv: pvWith(v1.PersistentVolumeSource{VsphereVolume: &v1.VsphereVirtualDiskVolumeSource{}}), wantErr: "empty volumePath"},
		{name: "portworx empty id", inline: inlineWith(v1.VolumeSource{PortworxVolume: &v1.PortworxVolumeSource{}}), wantErr: "empty volumeID"},
		{name: "iscsi no portal", pv: pvWith(v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{IQN: "iqn.x"}}), wantErr: "targetPortal"},
		{name: "iscsi no iqn", inline: inlineWith(v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "p"}}), wantErr: "iqn"},
		{name: "fc nothing", pv: pvWith(v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{Lun: lun(0)}}), wantErr: "targetWWNs"},
		{name: "csi pv no driver", pv: pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{VolumeHandle: "h"}}), wantErr: "driver"},
		{name: "csi pv no handle", pv: pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d"}}), wantErr: "volumeHandle"},
		{name: "pv without source", pv: pvWith(v1.PersistentVolumeSource{}), wantErr: "no volume source"},
		{name: "claim", inline: inlineWith(v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}), wantErr: "claim"},
		{name: "ephemeral", inline: inlineWith(v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}), wantErr: "claim"},
		{name: "nothing", wantErr: "neither"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plugin, name, err := InTreeName(tc.pv, tc.inline)
			checkErr(t, err, tc.wantNotAtt, tc.wantErr)
			if plugin != tc.wantPlugin || name != tc.want {
				t.Errorf("InTreeName = (%q, %q), want (%q, %q)", plugin, name, tc.wantPlugin, tc.want)
			}
		})
	}
}

// checkErr fails t unless err matches: wraps ErrNotAttachable when notAtt,
// else contains substr (and doesn't wrap ErrNotAttachable), else nil.
func checkErr(t *testing.T, err error, notAtt bool, substr string) {
	t.Helper()
	switch {
	case notAtt:
		if !errors.Is(err, ErrNotAttachable) {
			t.Fatalf("error = %v, want one wrapping ErrNotAttachable", err)
		}
	case substr != "":
		if err == nil || !strings.Contains(err.Error(), substr) {
			t.Fatalf("error = %v, want one containing %q", err, substr)
		}
		if errors.Is(err, ErrNotAttachable) {
			t.Fatalf("error %v must not wrap ErrNotAttachable: the source is malformed", err)
		}
	default:
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
	}
}
