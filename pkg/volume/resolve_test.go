package volume

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
)

// fakeDecider answers every question the same way and records who asked.
type fakeDecider struct {
	kind  Kind
	err   error
	calls []string
}

func (f *fakeDecider) decide(node, plugin string) (Kind, error) {
	f.calls = append(f.calls, node+"|"+plugin)
	return f.kind, f.err
}

func TestResolve(t *testing.T) {
	const node = "node-1"
	rwo, rwx, rox, rwop := v1.ReadWriteOnce, v1.ReadWriteMany, v1.ReadOnlyMany, v1.ReadWriteOncePod
	pending := errors.New("waiting for CSINode node-1 to decide whether in-tree plugin kubernetes.io/aws-ebs is migrated")

	csiPV := pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1", ReadOnly: true}}, rwo)
	csiPVRWX := pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}, rwx, rox)
	csiPVRWOP := pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}, rwop)
	csiPVRWOROX := pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}, rwo, rox)
	csiPVRWOPRWX := pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}}, rwop, rwx)
	csiPVNoModes := pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h1"}})
	ebsPV := pvWith(v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-abc"}}, rwo)
	ebsPVZoned := pvWith(v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-abc"}}, rox)
	ebsPVBadID := pvWith(v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/not-a-volume"}})
	gcePVRWX := pvWith(v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}}, rwx)
	gcePVRWX.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}
	pxPV := pvWith(v1.PersistentVolumeSource{PortworxVolume: &v1.PortworxVolumeSource{VolumeID: "px-1"}}, rwx)
	shared := v1.AzureSharedBlobDisk
	azurePVShared := pvWith(v1.PersistentVolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "uri", Kind: &shared}})
	azureFilePV := pvWith(v1.PersistentVolumeSource{AzureFile: &v1.AzureFilePersistentVolumeSource{ShareName: "s", SecretName: "sec"}}, rwx)
	iscsiPV := pvWith(v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", ReadOnly: true}}, rwo)
	nfsPV := pvWith(v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "s", Path: "/"}}, rwx)

	ebsInline := inlineWith(v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-abc"}})
	gceInlineRO := inlineWith(v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", ReadOnly: true}})
	azureInline := inlineWith(v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d", DataDiskURI: "uri-1"}})
	cinderInline := inlineWith(v1.VolumeSource{Cinder: &v1.CinderVolumeSource{VolumeID: "c-1"}})
	fcInline := inlineWith(v1.VolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"id1"}}})
	csiInline := inlineWith(v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: "d.example.com"}})
	azureFileInline := inlineWith(v1.VolumeSource{AzureFile: &v1.AzureFileVolumeSource{ShareName: "s", SecretName: "sec"}})

	const (
		ebsCSIName   = Name("kubernetes.io/csi/ebs.csi.aws.com^vol-abc")
		ebsInTree    = Name("kubernetes.io/aws-ebs/vol-abc")
		gceInlineHdl = "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"
	)

	tests := []struct {
		name       string
		src        Source
		decider    *fakeDecider // nil: Resolve gets a nil Decider
		want       *Spec
		wantInline *v1.PersistentVolumeAccessMode // InlineSpec must be set, with this single access mode
		wantCalls  []string
		wantNotAtt bool
		wantErr    string
	}{
		// Native CSI.
		{
			name: "csi pv rwo", src: Source{PV: csiPV}, decider: &fakeDecider{},
			want: &Spec{Name: "kubernetes.io/csi/d.example.com^h1", Kind: KindCSI, PluginName: CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "h1", PVName: "pv-1", PV: csiPV, SingleNode: true, ReadOnly: true},
		},
		{
			name: "csi pv rwx+rox is multi-node", src: Source{PV: csiPVRWX}, decider: &fakeDecider{},
			want: &Spec{Name: "kubernetes.io/csi/d.example.com^h1", Kind: KindCSI, PluginName: CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "h1", PVName: "pv-1", PV: csiPVRWX},
		},
		{
			name: "csi pv rwop is single-node", src: Source{PV: csiPVRWOP}, decider: &fakeDecider{},
			want: &Spec{Name: "kubernetes.io/csi/d.example.com^h1", Kind: KindCSI, PluginName: CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "h1", PVName: "pv-1", PV: csiPVRWOP, SingleNode: true},
		},
		{
			// Upstream's IsMultiAttachAllowed: any RWX or ROX allows it,
			// whatever else the PV lists (a static PV shared read-only).
			name: "csi pv rwo+rox is multi-node", src: Source{PV: csiPVRWOROX}, decider: &fakeDecider{},
			want: &Spec{Name: "kubernetes.io/csi/d.example.com^h1", Kind: KindCSI, PluginName: CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "h1", PVName: "pv-1", PV: csiPVRWOROX},
		},
		{
			name: "csi pv rwop+rwx is multi-node", src: Source{PV: csiPVRWOPRWX}, decider: &fakeDecider{},
			want: &Spec{Name: "kubernetes.io/csi/d.example.com^h1", Kind: KindCSI, PluginName: CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "h1", PVName: "pv-1", PV: csiPVRWOPRWX},
		},
		{
			name: "csi pv without access modes is multi-node", src: Source{PV: csiPVNoModes}, decider: &fakeDecider{},
			want: &Spec{Name: "kubernetes.io/csi/d.example.com^h1", Kind: KindCSI, PluginName: CSIPluginName,
				Driver: "d.example.com", VolumeHandle: "h1", PVName: "pv-1", PV: csiPVNoModes},
		},
		{
			name: "csi pv without handle", decider: &fakeDecider{},
			src:     Source{PV: pvWith(v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d"}})},
			wantErr: "volumeHandle",
		},
		{name: "inline csi is never attached", src: Source{Inline: csiInline}, decider: &fakeDecider{}, wantNotAtt: true},

		// Migratable PV.
		{
			name: "ebs pv migrated on node", src: Source{PV: ebsPV}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: ebsCSIName, Aliases: []Name{ebsInTree}, Kind: KindCSI, Migrated: true,
				PluginName: "kubernetes.io/aws-ebs", Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc",
				PVName: "pv-1", PV: ebsPV, SingleNode: true},
			wantCalls: []string{"node-1|kubernetes.io/aws-ebs"},
		},
		{
			name: "ebs pv in-tree on node keeps its own id", src: Source{PV: ebsPVZoned}, decider: &fakeDecider{kind: KindInTree},
			want: &Spec{Name: "kubernetes.io/aws-ebs/aws://us-east-1a/vol-abc", Aliases: []Name{ebsCSIName}, Kind: KindInTree,
				PluginName: "kubernetes.io/aws-ebs", Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc",
				PVName: "pv-1", PV: ebsPVZoned},
			wantCalls: []string{"node-1|kubernetes.io/aws-ebs"},
		},
		{
			name: "ebs pv pending", src: Source{PV: ebsPV}, decider: &fakeDecider{err: pending},
			want: &Spec{Name: ebsInTree, Aliases: []Name{ebsCSIName}, Pending: pending.Error(),
				PluginName: "kubernetes.io/aws-ebs", Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc",
				PVName: "pv-1", PV: ebsPV, SingleNode: true},
			wantCalls: []string{"node-1|kubernetes.io/aws-ebs"},
		},
		{
			name: "ebs pv pending, since when known", src: Source{PV: ebsPV}, decider: &fakeDecider{err: pendingSinceErr{}},
			want: &Spec{Name: ebsInTree, Aliases: []Name{ebsCSIName}, Pending: pendingSinceErr{}.Error(), PendingSince: pendingSinceT,
				PluginName: "kubernetes.io/aws-ebs", Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc",
				PVName: "pv-1", PV: ebsPV, SingleNode: true},
			wantCalls: []string{"node-1|kubernetes.io/aws-ebs"},
		},
		{
			// Translation turns RWX into RWO and the zone label into the handle.
			name: "gce pd rwx pv is single-node once translated", src: Source{PV: gcePVRWX}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: "kubernetes.io/csi/pd.csi.storage.gke.io^projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
				Aliases: []Name{"kubernetes.io/gce-pd/disk-1"}, Kind: KindCSI, Migrated: true,
				PluginName: "kubernetes.io/gce-pd", Driver: "pd.csi.storage.gke.io",
				VolumeHandle: "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
				PVName:       "pv-1", PV: gcePVRWX, SingleNode: true},
			wantCalls: []string{"node-1|kubernetes.io/gce-pd"},
		},
		{
			name: "portworx rwx pv migrated", src: Source{PV: pxPV}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: "kubernetes.io/csi/pxd.portworx.com^px-1", Aliases: []Name{"kubernetes.io/portworx-volume/px-1"},
				Kind: KindCSI, Migrated: true, PluginName: "kubernetes.io/portworx-volume", Driver: "pxd.portworx.com",
				VolumeHandle: "px-1", PVName: "pv-1", PV: pxPV},
			wantCalls: []string{"node-1|kubernetes.io/portworx-volume"},
		},
		{name: "ebs pv with bad id fails translation", src: Source{PV: ebsPVBadID}, decider: &fakeDecider{kind: KindCSI}, wantErr: "translate"},
		{name: "azure shared disk can't be translated", src: Source{PV: azurePVShared}, decider: &fakeDecider{kind: KindCSI}, wantErr: "translate"},
		{name: "azure file pv needs no attach", src: Source{PV: azureFilePV}, decider: &fakeDecider{kind: KindCSI}, wantNotAtt: true},
		{name: "unknown kind from decider", src: Source{PV: ebsPV}, decider: &fakeDecider{kind: "nfs"}, wantErr: "unknown kind",
			wantCalls: []string{"node-1|kubernetes.io/aws-ebs"}},
		{name: "migratable without decider", src: Source{PV: ebsPV}, wantErr: "no Decider"},

		// Migratable inline.
		{
			name: "ebs inline migrated carries translated spec", src: Source{Inline: ebsInline, PodNamespace: "ns"}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: ebsCSIName, Aliases: []Name{ebsInTree}, Kind: KindCSI, Migrated: true,
				PluginName: "kubernetes.io/aws-ebs", Driver: "ebs.csi.aws.com", VolumeHandle: "vol-abc",
				Inline: ebsInline, SingleNode: true},
			wantInline: &rwo,
			wantCalls:  []string{"node-1|kubernetes.io/aws-ebs"},
		},
		{
			name: "read-only gce inline is multi-node", src: Source{Inline: gceInlineRO}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: "kubernetes.io/csi/pd.csi.storage.gke.io^" + gceInlineHdl, Aliases: []Name{"kubernetes.io/gce-pd/disk-1"},
				Kind: KindCSI, Migrated: true, PluginName: "kubernetes.io/gce-pd", Driver: "pd.csi.storage.gke.io",
				VolumeHandle: gceInlineHdl, Inline: gceInlineRO, ReadOnly: true},
			wantInline: &rox,
			wantCalls:  []string{"node-1|kubernetes.io/gce-pd"},
		},
		{
			name: "azure disk inline in-tree is single-node", src: Source{Inline: azureInline}, decider: &fakeDecider{kind: KindInTree},
			want: &Spec{Name: "kubernetes.io/azure-disk/uri-1", Aliases: []Name{"kubernetes.io/csi/disk.csi.azure.com^uri-1"},
				Kind: KindInTree, PluginName: "kubernetes.io/azure-disk", Driver: "disk.csi.azure.com", VolumeHandle: "uri-1",
				Inline: azureInline, SingleNode: true},
			wantCalls: []string{"node-1|kubernetes.io/azure-disk"},
		},
		{
			name: "cinder inline pending is single-node", src: Source{Inline: cinderInline}, decider: &fakeDecider{err: pending},
			want: &Spec{Name: "kubernetes.io/cinder/c-1", Aliases: []Name{"kubernetes.io/csi/cinder.csi.openstack.org^c-1"},
				Pending: pending.Error(), PluginName: "kubernetes.io/cinder", Driver: "cinder.csi.openstack.org", VolumeHandle: "c-1",
				Inline: cinderInline, SingleNode: true},
			wantCalls: []string{"node-1|kubernetes.io/cinder"},
		},
		{name: "azure file inline needs no attach", src: Source{Inline: azureFileInline, PodNamespace: "ns"}, decider: &fakeDecider{kind: KindCSI}, wantNotAtt: true},

		// Never migrated.
		{
			name: "iscsi pv is in-tree without asking", src: Source{PV: iscsiPV}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: "kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:storage:0", Kind: KindInTree,
				PluginName: "kubernetes.io/iscsi", PVName: "pv-1", PV: iscsiPV, SingleNode: true, ReadOnly: true},
		},
		{
			name: "fc inline is in-tree and multi-node", src: Source{Inline: fcInline}, decider: &fakeDecider{kind: KindCSI},
			want: &Spec{Name: "kubernetes.io/fc/[id1]", Kind: KindInTree, PluginName: "kubernetes.io/fc", Inline: fcInline},
		},
		{name: "nfs pv", src: Source{PV: nfsPV}, decider: &fakeDecider{}, wantNotAtt: true},
		{name: "both pv and inline", src: Source{PV: ebsPV, Inline: ebsInline}, decider: &fakeDecider{}, wantErr: "both given"},
		{name: "empty source", decider: &fakeDecider{}, wantErr: "neither"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			var decide Decider
			if tc.decider != nil {
				decide = tc.decider.decide
			}
			got, err := Resolve(logger, tc.src, node, decide)
			if tc.decider != nil && !reflect.DeepEqual(tc.decider.calls, tc.wantCalls) {
				t.Errorf("Decider calls = %q, want %q", tc.decider.calls, tc.wantCalls)
			}
			checkErr(t, err, tc.wantNotAtt, tc.wantErr)
			if err != nil {
				if got != nil {
					t.Errorf("got Spec %+v with an error", got)
				}
				return
			}
			checkInlineSpec(t, got, tc.wantInline)
			got.InlineSpec = nil // checked above
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Resolve() mismatch\n got: %s\nwant: %s", dump(got), dump(tc.want))
			}
		})
	}
}

func checkInlineSpec(t *testing.T, got *Spec, mode *v1.PersistentVolumeAccessMode) {
	t.Helper()
	if mode == nil {
		if got.InlineSpec != nil {
			t.Errorf("InlineSpec = %+v, want nil", got.InlineSpec)
		}
		return
	}
	s := got.InlineSpec
	if s == nil || s.CSI == nil {
		t.Fatalf("InlineSpec = %+v, want a translated CSI spec", s)
	}
	if s.CSI.Driver != got.Driver || s.CSI.VolumeHandle != got.VolumeHandle {
		t.Errorf("InlineSpec CSI = %s/%s, want %s/%s", s.CSI.Driver, s.CSI.VolumeHandle, got.Driver, got.VolumeHandle)
	}
	if !reflect.DeepEqual(s.AccessModes, []v1.PersistentVolumeAccessMode{*mode}) {
		t.Errorf("InlineSpec access modes = %v, want [%s]", s.AccessModes, *mode)
	}
}

func dump(s *Spec) string {
	if s == nil {
		return "<nil>"
	}
	c := *s
	// Print the origin by name: the objects themselves are compared by pointer.
	pv, inline := "", ""
	if c.PV != nil {
		pv = c.PV.Name
	}
	if c.Inline != nil {
		inline = c.Inline.Name
	}
	c.PV, c.Inline = nil, nil
	return fmt.Sprintf("%+v PV=%q Inline=%q", c, pv, inline)
}

func TestAllNames(t *testing.T) {
	s := &Spec{Name: "a", Aliases: []Name{"b"}}
	if got := s.AllNames(); !reflect.DeepEqual(got, []Name{"a", "b"}) {
		t.Errorf("AllNames = %v", got)
	}
}

var pendingSinceT = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// pendingSinceErr is undecided since pendingSinceT.
type pendingSinceErr struct{}

func (pendingSinceErr) Error() string           { return "driver not registered yet" }
func (pendingSinceErr) PendingSince() time.Time { return pendingSinceT }
