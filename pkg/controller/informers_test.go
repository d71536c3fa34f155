package controller

import (
	"strings"
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestTrimPod(t *testing.T) {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u", Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "x"}}},
		Spec: v1.PodSpec{NodeName: "n", Containers: []v1.Container{{Name: "c", Image: "i"}}, Volumes: []v1.Volume{
			{Name: "cm", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}},
			{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
			{Name: "eph", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{
				VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{}}}},
			{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol"}}},
		}},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{Name: "c"}}},
	}
	obj, err := Trim(pod)
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*v1.Pod)
	if got.Labels != nil || got.ManagedFields != nil || got.Spec.Containers != nil || got.Status.ContainerStatuses != nil {
		t.Errorf("unused fields kept: %+v", got)
	}
	if got.Name != "p" || got.Namespace != "ns" || got.UID != "u" || got.Spec.NodeName != "n" || got.Status.Phase != v1.PodRunning {
		t.Errorf("needed fields lost: %+v", got)
	}
	var names []string
	for _, v := range got.Spec.Volumes {
		names = append(names, v.Name)
	}
	if want := []string{"data", "eph", "ebs"}; len(names) != len(want) || names[0] != want[0] || names[1] != want[1] || names[2] != want[2] {
		t.Errorf("volumes kept %v, want %v", names, want)
	}
	if got.Spec.Volumes[1].Ephemeral == nil || got.Spec.Volumes[1].Ephemeral.VolumeClaimTemplate != nil {
		t.Errorf("ephemeral volume: want the marker without its template, got %+v", got.Spec.Volumes[1])
	}
	if volume.ClaimName(got, &got.Spec.Volumes[1]) != "p-eph" {
		t.Errorf("ephemeral claim name %q, want p-eph", volume.ClaimName(got, &got.Spec.Volumes[1]))
	}
}

func TestSamePodFacts(t *testing.T) {
	base := func() *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", UID: "u", ResourceVersion: "1"},
			Spec:   v1.PodSpec{NodeName: "n", Volumes: []v1.Volume{{Name: "v"}}},
			Status: v1.PodStatus{Phase: v1.PodRunning}}
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		change func(*v1.Pod)
		same   bool
	}{
		{"resource version only", func(p *v1.Pod) { p.ResourceVersion = "2" }, true},
		{"scheduled elsewhere", func(p *v1.Pod) { p.Spec.NodeName = "m" }, false},
		{"terminated", func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }, false},
		{"being deleted", func(p *v1.Pod) { p.DeletionTimestamp = &now }, false},
		{"recreated", func(p *v1.Pod) { p.UID = "u2" }, false},
		{"volumes", func(p *v1.Pod) { p.Spec.Volumes = nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := base()
			tc.change(b)
			if got := samePodFacts(base(), b); got != tc.same {
				t.Errorf("samePodFacts = %v, want %v", got, tc.same)
			}
		})
	}
}

func TestNodeInfo(t *testing.T) {
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n", Annotations: map[string]string{managedAnnotation: "true", "other": "x"}},
		Spec:       v1.NodeSpec{Taints: []v1.Taint{{Key: outOfServiceTaint, Effect: v1.TaintEffectNoExecute}}},
		Status: v1.NodeStatus{
			Conditions: []v1.NodeCondition{
				{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse},
				{Type: v1.NodeReady, Status: v1.ConditionTrue, LastHeartbeatTime: metav1.Now()},
			},
			VolumesInUse: []v1.UniqueVolumeName{"kubernetes.io/csi/d^h"},
			Images:       []v1.ContainerImage{{Names: []string{"big"}}},
		},
	}
	obj, err := Trim(node)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := obj.(*v1.Node)
	if trimmed.Status.Images != nil || len(trimmed.Annotations) != 1 || len(trimmed.Status.Conditions) != 1 {
		t.Errorf("unused node fields kept: %+v", trimmed)
	}
	if !trimmed.Status.Conditions[0].LastHeartbeatTime.IsZero() {
		t.Errorf("heartbeat kept: a heartbeat would re-queue the node")
	}
	info := NodeInfo(trimmed)
	if !info.Exists || !info.Managed || !info.Ready || !info.OutOfService || !info.InUse[volume.Name("kubernetes.io/csi/d^h")] {
		t.Errorf("nodeInfo = %+v", info)
	}
	later := trimmed.DeepCopy()
	later.ResourceVersion = "9"
	if !sameNodeFacts(trimmed, later) {
		t.Errorf("a heartbeat-only update counts as a change")
	}
	later.Status.VolumesInUse = nil
	if sameNodeFacts(trimmed, later) {
		t.Errorf("a volumesInUse change is not seen")
	}
}

func TestTrimPVAndClaim(t *testing.T) {
	fs := v1.PersistentVolumeFilesystem
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv", UID: "u", ResourceVersion: "7", Labels: map[string]string{"topology.kubernetes.io/zone": "z"},
			Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": "ebs.csi.aws.com"}, Finalizers: []string{"kubernetes.io/pv-protection"}},
		Spec: v1.PersistentVolumeSpec{
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
			PersistentVolumeSource: v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1"}},
			AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce, v1.ReadOnlyMany},
			ClaimRef:               &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "c", UID: "cu", ResourceVersion: "3"},
			StorageClassName:       "gp3", MountOptions: []string{"noatime"}, VolumeMode: &fs,
			NodeAffinity: &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound, Message: "m"},
	}
	obj, err := Trim(pv.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := obj.(*v1.PersistentVolume)
	if got.Annotations != nil || got.Finalizers != nil || got.Spec.Capacity != nil || got.Spec.StorageClassName != "" ||
		got.Spec.MountOptions != nil || got.Status.Message != "" {
		t.Errorf("unused fields kept: %+v", got)
	}
	if got.Name != "pv" || got.UID != "u" || got.ResourceVersion != "7" || got.Labels["topology.kubernetes.io/zone"] != "z" ||
		got.Spec.AWSElasticBlockStore == nil || len(got.Spec.AccessModes) != 2 || got.Spec.VolumeMode == nil ||
		got.Spec.NodeAffinity == nil || got.Status.Phase != v1.VolumeBound {
		t.Errorf("needed fields lost: %+v", got)
	}
	if r := got.Spec.ClaimRef; r == nil || r.Namespace != "ns" || r.Name != "c" || r.UID != "cu" {
		t.Errorf("claimRef %+v, want ns/c uid cu", r)
	}

	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "cu", ResourceVersion: "3",
			Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes"}, Finalizers: []string{"kubernetes.io/pvc-protection"}},
		Spec: v1.PersistentVolumeClaimSpec{VolumeName: "pv", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")}}},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")}},
	}
	obj, err = Trim(pvc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	gotPVC := obj.(*v1.PersistentVolumeClaim)
	if gotPVC.Annotations != nil || gotPVC.Finalizers != nil || gotPVC.Spec.AccessModes != nil || gotPVC.Spec.Resources.Requests != nil ||
		gotPVC.Status.Capacity != nil {
		t.Errorf("unused fields kept: %+v", gotPVC)
	}
	if gotPVC.Namespace != "ns" || gotPVC.Name != "c" || gotPVC.UID != "cu" || gotPVC.ResourceVersion != "3" ||
		gotPVC.Spec.VolumeName != "pv" || gotPVC.Status.Phase != v1.ClaimBound {
		t.Errorf("needed fields lost: %+v", gotPVC)
	}
}

// A CSI PV keeps its driver, handle and read-only flag, not its attributes
// or secret references; the node, namespace and driver names that many
// objects repeat are held once.
func TestTrimCSIAndSharedStrings(t *testing.T) {
	csiPV := func() *v1.PersistentVolume {
		return &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "pv"},
			Spec: v1.PersistentVolumeSpec{
				PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
					Driver: strings.Clone("ebs.csi.aws.com"), VolumeHandle: "vol-1", ReadOnly: true, FSType: "ext4",
					VolumeAttributes:           map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-8081-ebs.csi.aws.com"},
					ControllerPublishSecretRef: &v1.SecretReference{Name: "s", Namespace: "kube-system"},
				}},
				ClaimRef: &v1.ObjectReference{Namespace: strings.Clone("team-a"), Name: "c"},
			},
		}
	}
	trimmed := func(o runtime.Object) runtime.Object {
		t.Helper()
		out, err := Trim(o)
		if err != nil {
			t.Fatal(err)
		}
		return out.(runtime.Object)
	}
	a, b := trimmed(csiPV()).(*v1.PersistentVolume), trimmed(csiPV()).(*v1.PersistentVolume)
	want := v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-1", ReadOnly: true}
	if got := a.Spec.CSI; got == nil || !apiequality.Semantic.DeepEqual(*got, want) {
		t.Errorf("CSI source %+v, want %+v", got, want)
	}
	same := func(what, x, y string) {
		t.Helper()
		if x != y || unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: %q and %q are not one copy", what, x, y)
		}
	}
	same("driver", a.Spec.CSI.Driver, b.Spec.CSI.Driver)
	same("claimRef namespace", a.Spec.ClaimRef.Namespace, b.Spec.ClaimRef.Namespace)

	pod := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: strings.Clone("team-a"), Name: name},
			Spec: v1.PodSpec{NodeName: strings.Clone("node-1")}}
	}
	p, q := trimmed(pod("p")).(*v1.Pod), trimmed(pod("q")).(*v1.Pod)
	same("node name", p.Spec.NodeName, q.Spec.NodeName)
	same("pod namespace", p.Namespace, q.Namespace)
	same("namespace of a pod and of a PV's claim", p.Namespace, a.Spec.ClaimRef.Namespace)
}

// The handlers queue nothing for the adds of the initial list (Recover
// covers those objects), but the ref indexes record them; every later add,
// update and delete reaches the handler.
func TestAfterInitialList(t *testing.T) {
	pod := func(name, claim string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: v1.PodSpec{Volumes: []v1.Volume{
			{Name: "data", VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}}}
	}
	var seen []string
	record := func(what string) func(obj any) {
		return func(obj any) { seen = append(seen, what+" "+obj.(*v1.Pod).Name) }
	}
	x := newRefIndex()
	h := indexed(x, podClaims, afterInitialList(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record("add"),
		UpdateFunc: func(_, obj any) { record("update")(obj) },
		DeleteFunc: record("delete"),
	}))
	listed, created := pod("listed", "claim-a"), pod("created", "claim-b")
	h.OnAdd(listed, true)
	h.OnAdd(created, false)
	h.OnUpdate(listed, pod("listed", "claim-c"))
	h.OnDelete(created)
	if want := []string{"add created", "update listed", "delete created"}; strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Errorf("handler saw %q, want %q", seen, want)
	}
	for claim, want := range map[string]string{"ns/claim-a": "", "ns/claim-b": "", "ns/claim-c": "ns/listed"} {
		if got := strings.Join(x.get(claim), ","); got != want {
			t.Errorf("pods of %s: %q, want %q", claim, got, want)
		}
	}
	h.OnAdd(pod("again", "claim-a"), true)
	if got := strings.Join(x.get("ns/claim-a"), ","); got != "ns/again" {
		t.Errorf("an initial add not indexed: pods of ns/claim-a %q, want ns/again", got)
	}
}
