package integration

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const (
	// allKindsEBSDriver and allKindsEBSPlugin: the node migrates EBS volumes
	// to this driver (its CSINode says so).
	allKindsEBSDriver = "ebs.csi.aws.com"
	allKindsEBSPlugin = "kubernetes.io/aws-ebs"
)

// Every kind of volume a pod can have, one pod each on a managed node, goes
// through the real informers and their cache transforms: the exact set of
// VolumeAttachments (name, attacher, source, node) and of
// node.status.volumesAttached entries is checked once settled, and nothing
// else appears afterwards.
//
// Attached through a VolumeAttachment: a CSI PV bound to a claim
// (ReadWriteOnce), ReadWriteMany, ReadOnlyMany, [ReadWriteOnce,
// ReadOnlyMany], a block volume, a generic ephemeral volume (its claim made
// as the ephemeral controller makes it: <pod>-<volume>, the pod its
// controller), a claim bound only after its pod was created, and migrated
// in-tree EBS volumes, a PV (source: the PV) and one inline in the pod
// (source: the translated spec). Recorded in node status only, with no
// VolumeAttachment, as upstream (the node logs in to the target or finds
// the disk): an inline iSCSI volume and an FC PV. Nothing at all: an inline
// CSI volume, a CSI driver with attachRequired=false, and a claim named as
// a generic ephemeral volume's but not created for the pod.
func TestAllKinds(t *testing.T) {
	e := newEnv(t, "allkinds")
	driver := e.name("csi.test")
	noAttach := e.name("noattach.csi.test")
	inline := e.name("inline.csi.test")
	node := e.createNode("node", true)
	e.createCSIDriver(driver, new(true))
	e.createCSIDriver(noAttach, new(false))
	e.createCSIDriver(inline, new(true))
	e.createCSINode(node, []storagev1.CSINodeDriver{
		framework.CSINodeDriver(driver, node), framework.CSINodeDriver(allKindsEBSDriver, "i-"+node),
	}, allKindsEBSPlugin)
	handle := func(kind string) string { return "vol-" + e.prefix + "-" + kind }
	rwo, rox, rwx := v1.ReadWriteOnce, v1.ReadOnlyMany, v1.ReadWriteMany

	// Claims bound before their pods come.
	want := allKindsWant{node: node, vas: map[string]string{}}
	for _, c := range []struct {
		kind  string
		modes []v1.PersistentVolumeAccessMode
	}{{"pvc", nil}, {"rwx", []v1.PersistentVolumeAccessMode{rwx}}, {"rox", []v1.PersistentVolumeAccessMode{rox}},
		{"rwo-rox", []v1.PersistentVolumeAccessMode{rwo, rox}}} {
		pv := e.createCSIClaim(c.kind, driver, handle(c.kind), c.modes...)
		want.csi(driver, handle(c.kind), pv.Name)
	}
	e.createCSIClaim("noattach", noAttach, handle("noattach"))
	block := e.createBlockClaim("block", framework.CSISource(driver, handle("block")))
	want.csi(driver, handle("block"), block)
	migrated := e.createClaim("mig-pv", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{
		VolumeID: handle("mig-pv"), FSType: "ext4"}})
	want.csi(allKindsEBSDriver, handle("mig-pv"), migrated.Name)
	e.createClaim("fc", v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0982991b8dc5"}, Lun: new(int32(2))}})
	// As upstream's FC plugin names it: the WWN list as Go prints it.
	want.status = append(want.status, "kubernetes.io/fc/[500a0982991b8dc5]:2")
	// A claim named as pod-eph-foreign's ephemeral volume's, not made for it.
	foreign := framework.PVC(e.ns, "pod-eph-foreign-scratch", e.name("pv-eph-foreign"))
	e.createPendingClaim(foreign)
	e.createPV(framework.PV(e.name("pv-eph-foreign"), framework.CSISource(driver, handle("eph-foreign")), foreign))
	e.setClaimBound(foreign.Name)
	// A claim the pod waits for: bound later.
	late := framework.PVC(e.ns, "late", "")
	e.createPendingClaim(late)

	framework.StartAttacher(t, e.client, framework.AttacherOptions{Drivers: []string{driver, allKindsEBSDriver}})
	e.startController(nil)

	iqn := "iqn.2001-04.com.example:" + e.prefix
	pods := map[string][]v1.Volume{
		"pod-pvc":      framework.PVCVolumes("pvc"),
		"pod-rwx":      framework.PVCVolumes("rwx"),
		"pod-rox":      framework.PVCVolumes("rox"),
		"pod-rwo-rox":  framework.PVCVolumes("rwo-rox"),
		"pod-block":    framework.PVCVolumes("block"),
		"pod-noattach": framework.PVCVolumes("noattach"),
		"pod-mig-pv":   framework.PVCVolumes("mig-pv"),
		"pod-fc":       framework.PVCVolumes("fc"),
		"pod-late":     framework.PVCVolumes("late"),
		"pod-inline-csi": {{Name: "csi", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: inline,
			VolumeAttributes: map[string]string{"size": "1Gi"}}}}},
		"pod-mig-inline": {{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{
			VolumeID: "aws://us-east-1a/" + handle("mig-inline"), FSType: "ext4"}}}},
		"pod-iscsi": {{Name: "iscsi", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{
			TargetPortal: "10.0.0.1:3260", IQN: iqn, Lun: 0, FSType: "ext4"}}}},
		"pod-eph":         {allKindsEphemeral("scratch")},
		"pod-eph-foreign": {allKindsEphemeral("scratch")},
	}
	want.inline(allKindsEBSDriver, handle("mig-inline"))
	want.status = append(want.status, "kubernetes.io/iscsi/10.0.0.1:3260:"+iqn+":0")
	created := map[string]*v1.Pod{}
	for _, name := range slices.Sorted(maps.Keys(pods)) {
		p, err := framework.CreatePodWithVolumes(e.ctx, e.client, e.ns, name, node, pods[name]...)
		if err != nil {
			t.Fatal(err)
		}
		created[name] = p
	}

	// The ephemeral volume's claim, as the ephemeral controller makes it,
	// once the pod exists; then bound, as the PV controller would.
	eph := framework.PVC(e.ns, "pod-eph-scratch", e.name("pv-eph"))
	eph.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod-eph", UID: created["pod-eph"].UID,
		Controller: new(true), BlockOwnerDeletion: new(true)}}
	e.createPendingClaim(eph)
	e.createPV(framework.PV(e.name("pv-eph"), framework.CSISource(driver, handle("eph")), eph))
	e.setClaimBound(eph.Name)
	want.csi(driver, handle("eph"), e.name("pv-eph"))

	// pod-late came before pod-pvc on the watch: once pod-pvc's volume is
	// attached, pod-late has been seen with its claim pending. Now bound.
	e.waitAttached(driver, handle("pvc"), node)
	e.createPV(framework.PV(e.name("pv-late"), framework.CSISource(driver, handle("late")), late))
	e.bindClaim("late", e.name("pv-late"))
	want.csi(driver, handle("late"), e.name("pv-late"))

	var last error
	if !framework.Poll(t, waitTimeout, func() (bool, error) {
		last = e.allKindsCheck(want, true)
		return last == nil, nil
	}) {
		t.Fatalf("not exactly the VolumeAttachments and node status entries of every kind of volume after %s: %v", waitTimeout, last)
	}
	framework.Consistently(t, quietPeriod, func() error { return e.allKindsCheck(want, false) },
		"nothing more attached, reported or taken back")

	// Only the claim not made for its pod is told about; the ephemeral
	// volume's pod may have been read before its claim was made.
	e.waitEvent("pod-eph-foreign", v1.EventTypeWarning, "FailedAttachVolume", fmt.Sprintf(
		`AttachVolume.Attach failed for volume "scratch" : PersistentVolumeClaim %q was not created for this pod (generic ephemeral volume "scratch")`,
		e.ns+"/pod-eph-foreign-scratch"))
	for name := range pods {
		if name == "pod-eph" || name == "pod-eph-foreign" {
			continue
		}
		warnings, err := e.warnings(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(warnings) != 0 {
			t.Errorf("pod %s: unexpected warnings %q", name, warnings)
		}
	}
}

// allKindsWant is what TestAllKinds expects on its node: VolumeAttachments
// by name, described by allKindsDescribe, and node.status.volumesAttached
// names.
type allKindsWant struct {
	node   string
	vas    map[string]string
	status []string
}

// csi expects the VolumeAttachment of a CSI (or migrated) PV, attached and
// reported.
func (w *allKindsWant) csi(driver, handle, pv string) {
	name := framework.VolumeAttachmentName(handle, driver, w.node)
	w.vas[name] = fmt.Sprintf("attacher %s, node %s, persistentVolumeName %s", driver, w.node, pv)
	w.status = append(w.status, framework.CSIVolumeName(driver, handle))
}

// inline expects the VolumeAttachment of a migrated inline volume.
func (w *allKindsWant) inline(driver, handle string) {
	name := framework.VolumeAttachmentName(handle, driver, w.node)
	w.vas[name] = fmt.Sprintf("attacher %s, node %s, inlineVolumeSpec csi %s^%s", driver, w.node, driver, handle)
	w.status = append(w.status, framework.CSIVolumeName(driver, handle))
}

func allKindsDescribe(va *storagev1.VolumeAttachment) string {
	s := fmt.Sprintf("attacher %s, node %s", va.Spec.Attacher, va.Spec.NodeName)
	src := va.Spec.Source
	switch {
	case src.PersistentVolumeName != nil && src.InlineVolumeSpec == nil:
		s += ", persistentVolumeName " + *src.PersistentVolumeName
	case src.InlineVolumeSpec != nil && src.PersistentVolumeName == nil && src.InlineVolumeSpec.CSI != nil:
		s += fmt.Sprintf(", inlineVolumeSpec csi %s^%s", src.InlineVolumeSpec.CSI.Driver, src.InlineVolumeSpec.CSI.VolumeHandle)
	default:
		s += fmt.Sprintf(", source %+v", src)
	}
	return s
}

// allKindsCheck compares the node's VolumeAttachments and status with want;
// settled also requires every VolumeAttachment attached, not being deleted.
func (e *env) allKindsCheck(want allKindsWant, settled bool) error {
	vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	got := map[string]string{}
	var problems []string
	for i := range vas.Items {
		va := &vas.Items[i]
		if va.Spec.NodeName != want.node {
			continue
		}
		got[va.Name] = allKindsDescribe(va)
		if settled && (!va.Status.Attached || va.DeletionTimestamp != nil) {
			problems = append(problems, fmt.Sprintf("%s not attached or being deleted", va.Name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got)) {
		if w, ok := want.vas[name]; !ok || w != got[name] {
			problems = append(problems, fmt.Sprintf("VolumeAttachment %s: %s, want %q", name, got[name], w))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want.vas)) {
		if _, ok := got[name]; !ok {
			problems = append(problems, fmt.Sprintf("VolumeAttachment %s (%s) missing", name, want.vas[name]))
		}
	}
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, want.node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var listed []string
	for _, av := range n.Status.VolumesAttached {
		listed = append(listed, string(av.Name))
		if av.DevicePath != "" {
			problems = append(problems, fmt.Sprintf("volumesAttached[%s].devicePath %q, want empty", av.Name, av.DevicePath))
		}
	}
	slices.Sort(listed)
	if wantListed := slices.Sorted(slices.Values(want.status)); !slices.Equal(listed, wantListed) {
		problems = append(problems, fmt.Sprintf("node.status.volumesAttached %q, want %q", listed, wantListed))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// allKindsEphemeral is a generic ephemeral volume.
func allKindsEphemeral(name string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{
		VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			StorageClassName: new(""),
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		}}}}}
}

// createBlockClaim creates a claim and a PV of volumeMode Block bound to
// each other, and returns the PV's name.
func (e *env) createBlockClaim(claim string, src v1.PersistentVolumeSource) string {
	e.t.Helper()
	mode := v1.PersistentVolumeBlock
	pvName := e.name("pv-" + claim)
	pvc := framework.PVC(e.ns, claim, pvName)
	pvc.Spec.VolumeMode = &mode
	e.createPendingClaim(pvc)
	pv := framework.PV(pvName, src, pvc)
	pv.Spec.VolumeMode = &mode
	e.createPV(pv)
	e.setClaimBound(claim)
	return pvName
}

// bindClaim binds a pending claim to its PV, as the PV controller does:
// spec.volumeName first, then the phase.
func (e *env) bindClaim(claim, pv string) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, claim, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pvc.Spec.VolumeName = pv
		_, err = e.client.CoreV1().PersistentVolumeClaims(e.ns).Update(e.ctx, pvc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("bind claim %s to %s: %v", claim, pv, err)
	}
	e.setClaimBound(claim)
}
