package intree

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func resolve(t *testing.T, src volume.Source) *volume.Spec {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	spec, err := volume.Resolve(logger, src, "node-1", nil)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return spec
}

func TestRegistry(t *testing.T) {
	r := Builtin()
	if got, want := r.Names(), []string{"kubernetes.io/fc", "kubernetes.io/iscsi"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Builtin names = %v, want %v", got, want)
	}
	for _, name := range []string{volume.ISCSIPluginName, volume.FCPluginName} {
		p, err := r.Get(name)
		if err != nil || p.Name() != name {
			t.Errorf("Get(%s) = (%v, %v)", name, p, err)
		}
	}

	_, err := r.Get("kubernetes.io/aws-ebs")
	var noAttacher *NoAttacherError
	if !errors.As(err, &noAttacher) || noAttacher.Plugin != "kubernetes.io/aws-ebs" {
		t.Fatalf("Get(aws-ebs) error = %#v, want a NoAttacherError", err)
	}
	if !strings.Contains(err.Error(), "kubernetes.io/aws-ebs") {
		t.Errorf("error %q must name the plugin", err)
	}

	if _, err := NewRegistry().Get(volume.ISCSIPluginName); err == nil {
		t.Errorf("empty registry must have no attacher")
	}
}

func TestRegistryDuplicatePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Errorf("registering a plugin twice must panic")
		}
	}()
	NewRegistry(ISCSI{}, ISCSI{})
}

func TestRecordOnlyPlugins(t *testing.T) {
	lun := int32(2)
	iscsiPV := resolve(t, volume.Source{PV: &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-iscsi"},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.1:3260", IQN: "iqn.x", Lun: 1},
		}},
	}})
	iscsiInline := resolve(t, volume.Source{Inline: &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{
		ISCSI: &v1.ISCSIVolumeSource{TargetPortal: "10.0.0.2:3260", IQN: "iqn.y"},
	}}})
	fcPV := resolve(t, volume.Source{PV: &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-fc"},
		Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{
			FC: &v1.FCVolumeSource{TargetWWNs: []string{"w1"}, Lun: &lun},
		}},
	}})
	fcInline := resolve(t, volume.Source{Inline: &v1.Volume{Name: "v", VolumeSource: v1.VolumeSource{
		FC: &v1.FCVolumeSource{WWIDs: []string{"id1"}},
	}}})
	// Claims to be iSCSI but carries no iSCSI source.
	forged := &volume.Spec{Name: "kubernetes.io/iscsi/x", PluginName: volume.ISCSIPluginName, PV: &v1.PersistentVolume{}}

	tests := []struct {
		name    string
		plugin  Plugin
		own     []*volume.Spec
		foreign []*volume.Spec
	}{
		{name: "iscsi", plugin: ISCSI{}, own: []*volume.Spec{iscsiPV, iscsiInline}, foreign: []*volume.Spec{fcPV, fcInline, forged, nil}},
		{name: "fc", plugin: FC{}, own: []*volume.Spec{fcPV, fcInline}, foreign: []*volume.Spec{iscsiPV, iscsiInline, nil}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			for _, s := range tc.own {
				path, err := tc.plugin.Attach(ctx, s, "node-1")
				if err != nil || path != "" {
					t.Errorf("Attach(%s) = (%q, %v), want (\"\", nil)", s.Name, path, err)
				}
				if err := tc.plugin.Detach(ctx, s.Name, "node-1"); err != nil {
					t.Errorf("Detach(%s) = %v", s.Name, err)
				}
			}

			for _, s := range tc.foreign {
				if _, err := tc.plugin.Attach(ctx, s, "node-1"); err == nil {
					t.Errorf("Attach of a foreign spec %+v must fail", s)
				}
				if s != nil && s != forged {
					if err := tc.plugin.Detach(ctx, s.Name, "node-1"); err == nil {
						t.Errorf("Detach of foreign volume %s must fail", s.Name)
					}
				}
			}
		})
	}
}

// Every in-tree plugin that is never migrated and needs an attach has its
// attacher in this build, and no other plugin has one.
func TestBuiltinCoversThePluginTable(t *testing.T) {
	var want []string
	for _, p := range volume.InTreePlugins() {
		if !p.Migratable() && !p.NoAttach {
			want = append(want, p.Name)
		}
	}
	sort.Strings(want)
	if got := Builtin().Names(); !reflect.DeepEqual(got, want) {
		t.Errorf("Builtin names = %v, want the table's never-migrated plugins %v", got, want)
	}
}
