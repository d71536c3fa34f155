package sim

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"
)

const ns = "default"

func boundPVC(name, pv string) *v1.PersistentVolumeClaim {
	return &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: pv},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
}

func pvWith(name string, src v1.PersistentVolumeSource) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.PersistentVolumeSpec{PersistentVolumeSource: src},
	}
}

func claimVol(name, claim string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
}

func podWith(vols ...v1.Volume) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pod", UID: "pod-uid"},
		Spec:       v1.PodSpec{NodeName: "n-0", Volumes: vols},
	}
}

func newNamer(t *testing.T, migrated []string, pvcs []*v1.PersistentVolumeClaim, pvs []*v1.PersistentVolume) *Namer {
	t.Helper()
	pvcIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, pvc := range pvcs {
		if err := pvcIndexer.Add(pvc); err != nil {
			t.Fatal(err)
		}
	}
	pvIndexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, pv := range pvs {
		if err := pvIndexer.Add(pv); err != nil {
			t.Fatal(err)
		}
	}
	return &Namer{
		PVCs:     corelisters.NewPersistentVolumeClaimLister(pvcIndexer),
		PVs:      corelisters.NewPersistentVolumeLister(pvIndexer),
		Migrated: sets.New(migrated...),
	}
}

func TestPodVolumeNames(t *testing.T) {
	lun0, lun1 := int32(0), int32(1)
	csiPV := pvWith("pv-csi", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.example.com", VolumeHandle: "4"}})
	ebsPV := pvWith("pv-ebs", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-abc"}})
	ebsURLPV := pvWith("pv-ebs-url", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-def"}})
	iscsiPV := pvWith("pv-iscsi", v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", Lun: 0}})
	fcPV := pvWith("pv-fc", v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0981891b8dc5"}, Lun: &lun0}})
	fc2PV := pvWith("pv-fc2", v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"aa", "bb"}, Lun: &lun1}})
	fcWWIDPV := pvWith("pv-fc-wwid", v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"3600508b400105e21"}}})
	nfsPV := pvWith("pv-nfs", v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}})
	noHandlePV := pvWith("pv-nohandle", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "mock.csi.example.com"}})

	pending := boundPVC("pending", "")
	pending.Status.Phase = v1.ClaimPending
	ephemeralOwned := boundPVC("pod-eph", "pv-csi")
	ephemeralOwned.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: "pod", UID: "pod-uid", Controller: new(true)}}
	ephemeralForeign := boundPVC("pod-foreign", "pv-csi")
	ephemeralForeign.OwnerReferences = []metav1.OwnerReference{{Kind: "Pod", Name: "pod", UID: types.UID("other"), Controller: new(true)}}

	pvcs := []*v1.PersistentVolumeClaim{
		boundPVC("c-csi", "pv-csi"), boundPVC("c-ebs", "pv-ebs"), boundPVC("c-ebs-url", "pv-ebs-url"),
		boundPVC("c-iscsi", "pv-iscsi"), boundPVC("c-fc", "pv-fc"), boundPVC("c-fc2", "pv-fc2"),
		boundPVC("c-fc-wwid", "pv-fc-wwid"), boundPVC("c-nfs", "pv-nfs"), boundPVC("c-missing-pv", "pv-gone"),
		boundPVC("c-nohandle", "pv-nohandle"), pending, ephemeralOwned, ephemeralForeign,
	}
	pvs := []*v1.PersistentVolume{csiPV, ebsPV, ebsURLPV, iscsiPV, fcPV, fc2PV, fcWWIDPV, nfsPV, noHandlePV}
	ephemeral := func(name string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}
	}
	inline := func(name string, src v1.VolumeSource) v1.Volume { return v1.Volume{Name: name, VolumeSource: src} }

	tests := []struct {
		name     string
		migrated []string
		pod      *v1.Pod
		want     []string
		skipped  int
	}{
		{
			name: "CSI PV through a bound claim",
			pod:  podWith(claimVol("v", "c-csi")),
			want: []string{"kubernetes.io/csi/mock.csi.example.com^4"},
		},
		{
			name: "two volumes on one PV are one name",
			pod:  podWith(claimVol("a", "c-csi"), claimVol("b", "c-csi")),
			want: []string{"kubernetes.io/csi/mock.csi.example.com^4"},
		},
		{
			name:    "unbound, missing claim, missing PV and PV without handle are skipped",
			pod:     podWith(claimVol("a", "pending"), claimVol("b", "nope"), claimVol("c", "c-missing-pv"), claimVol("d", "c-nohandle"), claimVol("e", "c-csi")),
			want:    []string{"kubernetes.io/csi/mock.csi.example.com^4"},
			skipped: 4,
		},
		{
			name:     "migrated aws-ebs PV takes the CSI name",
			migrated: []string{"kubernetes.io/aws-ebs"},
			pod:      podWith(claimVol("a", "c-ebs"), claimVol("b", "c-ebs-url")),
			want:     []string{"kubernetes.io/csi/ebs.csi.aws.com^vol-abc", "kubernetes.io/csi/ebs.csi.aws.com^vol-def"},
		},
		{
			name:     "aws-ebs PV not migrated keeps the in-tree name",
			migrated: []string{"kubernetes.io/gce-pd"},
			pod:      podWith(claimVol("a", "c-ebs")),
			want:     []string{"kubernetes.io/aws-ebs/vol-abc"},
		},
		{
			name: "iscsi and fc PVs",
			pod:  podWith(claimVol("a", "c-iscsi"), claimVol("b", "c-fc"), claimVol("c", "c-fc2"), claimVol("d", "c-fc-wwid")),
			want: []string{
				"kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0",
				"kubernetes.io/fc/[500a0981891b8dc5]:0",
				"kubernetes.io/fc/[aa bb]:1",
				"kubernetes.io/fc/[3600508b400105e21]",
			},
		},
		{
			name: "not attachable: nfs PV, inline CSI, hostPath, emptyDir",
			pod: podWith(claimVol("a", "c-nfs"),
				inline("b", v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "inline.csi"}}),
				inline("c", v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/"}}),
				inline("d", v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}})),
		},
		{
			name:     "inline aws-ebs, migrated and not",
			migrated: []string{"kubernetes.io/aws-ebs"},
			pod: podWith(inline("a", v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1"}}),
				inline("b", v1.VolumeSource{Cinder: &v1.CinderVolumeSource{VolumeID: "c-1"}})),
			want: []string{"kubernetes.io/csi/ebs.csi.aws.com^vol-1", "kubernetes.io/cinder/c-1"},
		},
		{
			name:     "inline azure file is not attachable, migrated or not",
			migrated: []string{"kubernetes.io/azure-file"},
			pod:      podWith(inline("a", v1.VolumeSource{AzureFile: &v1.AzureFileVolumeSource{SecretName: "s", ShareName: "sh"}})),
		},
		{
			name: "inline iscsi and fc",
			pod: podWith(inline("a", v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.2", IQN: "iqn.x", Lun: 3}}),
				inline("b", v1.VolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"w1", "w2"}}})),
			want: []string{"kubernetes.io/iscsi/10.0.0.2:iqn.x:3", "kubernetes.io/fc/[w1 w2]"},
		},
		{
			name:     "inline gce-pd, migrated",
			migrated: []string{"kubernetes.io/gce-pd"},
			pod:      podWith(inline("a", v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "pd-1"}})),
			want:     []string{"kubernetes.io/csi/pd.csi.storage.gke.io^projects/UNSPECIFIED/zones/UNSPECIFIED/disks/pd-1"},
		},
		{
			name:    "generic ephemeral: only a claim owned by the pod counts",
			pod:     podWith(ephemeral("eph"), ephemeral("foreign")),
			want:    []string{"kubernetes.io/csi/mock.csi.example.com^4"},
			skipped: 1,
		},
		{
			name:    "malformed inline fc is skipped",
			pod:     podWith(inline("a", v1.VolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"aa"}}})),
			skipped: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			n := newNamer(t, tc.migrated, pvcs, pvs)
			got, skipped := n.PodVolumeNames(logger, tc.pod)
			if !got.Equal(sets.New(tc.want...)) {
				t.Errorf("names:\n got  %v\n want %v", sets.List(got), tc.want)
			}
			if len(skipped) != tc.skipped {
				t.Errorf("skipped %d volumes, want %d: %v", len(skipped), tc.skipped, skipped)
			}
			for _, err := range skipped {
				if !strings.Contains(err.Error(), "pod default/pod volume ") {
					t.Errorf("skip reason %q does not name the pod volume", err)
				}
			}
		})
	}
}
