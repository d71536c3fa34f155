package controller

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const (
	guardNoAttachDriver = "noattach.csi.example.com"
	guardInlineDriver   = "inline.csi.example.com"
	guardEBSDriver      = "ebs.csi.aws.com"
	guardGCEDriver      = "pd.csi.storage.gke.io"
)

var guardTime = metav1.NewTime(epoch.Add(-time.Hour))

// served gives an object what the API server and its writers leave on it:
// the guard's objects carry fields nobody reads, as real ones do.
func served(m *metav1.ObjectMeta, manager string) {
	m.ResourceVersion = "100"
	m.Generation = 2
	m.CreationTimestamp = guardTime
	if m.UID == "" {
		m.UID = types.UID("uid-" + m.Name)
	}
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels["app.kubernetes.io/part-of"] = "guard"
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations["guard.example.com/note"] = "kept by nobody"
	m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate,
		APIVersion: "v1", Time: &guardTime, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{}}`)}}
}

func guardNode(name string, managed, ready bool, opts ...func(*v1.Node)) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "us-east-1a"},
		Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0",
			"csi.volume.kubernetes.io/nodeid": `{"ebs.csi.aws.com":"i-` + name + `"}`}}}
	served(&n.ObjectMeta, "kubelet")
	if managed {
		n.Annotations[managedAnnotation] = "true"
	}
	readyStatus := v1.ConditionFalse
	if ready {
		readyStatus = v1.ConditionTrue
	}
	n.Spec = v1.NodeSpec{PodCIDR: "10.0.0.0/24", ProviderID: "aws:///us-east-1a/i-" + name,
		Taints: []v1.Taint{{Key: "example.com/dedicated", Value: "storage", Effect: v1.TaintEffectNoSchedule}}}
	n.Status = v1.NodeStatus{
		Capacity:    v1.ResourceList{v1.ResourceCPU: resource.MustParse("4")},
		Allocatable: v1.ResourceList{v1.ResourceCPU: resource.MustParse("3800m")},
		Conditions: []v1.NodeCondition{
			{Type: v1.NodeMemoryPressure, Status: v1.ConditionFalse, LastHeartbeatTime: guardTime, Reason: "KubeletHasSufficientMemory"},
			{Type: v1.NodeReady, Status: readyStatus, LastHeartbeatTime: guardTime, LastTransitionTime: guardTime, Reason: "KubeletReady"},
			{Type: v1.NodeNetworkUnavailable, Status: v1.ConditionTrue, Reason: "NoRouteCreated"},
		},
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}},
		NodeInfo:  v1.NodeSystemInfo{KubeletVersion: "v1.36.0", OperatingSystem: "linux"},
		Images:    []v1.ContainerImage{{Names: []string{"registry.k8s.io/pause:3.10"}, SizeBytes: 300000}},
	}
	for _, o := range opts {
		o(n)
	}
	return n
}

// guardClaim is a claim as the PV controller leaves it bound to volume
// (unbound when volume is empty).
func guardClaim(name, volume string, mode v1.PersistentVolumeMode, owner *v1.Pod) *v1.PersistentVolumeClaim {
	c := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-claim-" + name),
		Annotations: map[string]string{"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/storage-provisioner": driver},
		Finalizers:  []string{"kubernetes.io/pvc-protection"}}}
	served(&c.ObjectMeta, "kube-controller-manager")
	c.Spec = v1.PersistentVolumeClaimSpec{
		// A claim's modes are not its volume's: the PV's decide (upstream).
		AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
		Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
		StorageClassName: new("fast"), VolumeMode: &mode, VolumeName: volume,
	}
	c.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: c.Spec.AccessModes,
		Capacity: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}}
	if volume == "" {
		c.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimPending}
	}
	if owner != nil {
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID,
			Controller: new(true), BlockOwnerDeletion: new(true)}}
	}
	return c
}

// guardPV is a PV bound to claim c (claimRef naming it, its UID).
func guardPV(name string, src v1.PersistentVolumeSource, c *v1.PersistentVolumeClaim, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{"pv.kubernetes.io/provisioned-by": driver},
		Finalizers:  []string{"kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"}}}
	served(&pv.ObjectMeta, "csi-provisioner")
	pv.Spec = v1.PersistentVolumeSpec{
		Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
		PersistentVolumeSource:        src,
		AccessModes:                   modes,
		PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
		StorageClassName:              "fast",
		MountOptions:                  []string{"noatime"},
		VolumeMode:                    c.Spec.VolumeMode,
		ClaimRef: &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: c.Namespace,
			Name: c.Name, UID: c.UID, ResourceVersion: "90"},
	}
	pv.Status = v1.PersistentVolumeStatus{Phase: v1.VolumeBound, LastPhaseTransitionTime: &guardTime}
	return pv
}

func guardCSISource(drv, handle string) v1.PersistentVolumeSource {
	return v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: drv, VolumeHandle: handle, FSType: "ext4",
		VolumeAttributes:           map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-8081-" + drv},
		ControllerPublishSecretRef: &v1.SecretReference{Name: "publish", Namespace: "kube-system"}}}
}

func stateRunning() v1.ContainerState {
	return v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: guardTime}}
}

func stateTerminated() v1.ContainerState {
	return v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", FinishedAt: guardTime}}
}

func stateWaiting() v1.ContainerState {
	return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: "ContainerCreating"}}
}

// guardPod is a running pod on node with volumes, shaped as served.
func guardPod(name, node string, vols ...v1.Volume) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db", UID: "uid-db", Controller: new(true)}}}}
	served(&p.ObjectMeta, "kubelet")
	p.Spec = v1.PodSpec{NodeName: node, ServiceAccountName: "default", Volumes: vols,
		Containers: []v1.Container{{Name: "app", Image: "registry.example.com/app:1",
			VolumeMounts: []v1.VolumeMount{{Name: "token", MountPath: "/var/run/secrets"}}}}}
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "token", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{
		Sources: []v1.VolumeProjection{{ServiceAccountToken: &v1.ServiceAccountTokenProjection{Path: "token"}}}}}})
	p.Status = v1.PodStatus{Phase: v1.PodRunning, PodIP: "10.0.0.7", StartTime: &guardTime,
		Conditions:            []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: guardTime}},
		InitContainerStatuses: []v1.ContainerStatus{{Name: "init", State: stateTerminated(), Image: "busybox"}},
		ContainerStatuses:     []v1.ContainerStatus{{Name: "app", State: stateRunning(), Ready: true, Image: "registry.example.com/app:1"}}}
	return p
}

func claimVolume(name, claim string) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true}}}
}

func ephemeralVolume(name string, mode v1.PersistentVolumeMode) v1.Volume {
	return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{
		VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{Spec: v1.PersistentVolumeClaimSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, VolumeMode: &mode, StorageClassName: new("fast"),
			Resources: v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}}}}}}}
}

func guardVA(pvName, handle, drv, node string, inline *v1.PersistentVolumeSpec, opts ...vaOpt) *storagev1.VolumeAttachment {
	a := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: volume.AttachmentName(handle, drv, node),
		Annotations: map[string]string{"csi.alpha.kubernetes.io/node-id": "i-" + node},
		Finalizers:  []string{attacherFinalizer(drv)}},
		Spec:   storagev1.VolumeAttachmentSpec{Attacher: drv, NodeName: node},
		Status: storagev1.VolumeAttachmentStatus{Attached: true}}
	served(&a.ObjectMeta, "csi-attacher")
	if inline != nil {
		a.Spec.Source.InlineVolumeSpec = inline
	} else {
		a.Spec.Source.PersistentVolumeName = &pvName
	}
	for _, o := range opts {
		o(a)
	}
	return a
}

// attacherFinalizer is the external-attacher's finalizer for drv.
func attacherFinalizer(drv string) string {
	return "external-attacher/" + strings.NewReplacer(".", "-", "/", "-").Replace(drv)
}

// guardWorld is every kind of volume a pod can have, on nodes of every
// kind, with attachments to rebuild from after a restart.
func guardWorld(t *testing.T) []runtime.Object {
	t.Helper()
	block, fs := v1.PersistentVolumeBlock, v1.PersistentVolumeFilesystem
	rwo, rox, rwx := v1.ReadWriteOnce, v1.ReadOnlyMany, v1.ReadWriteMany
	var objs []runtime.Object
	add := func(o ...runtime.Object) { objs = append(objs, o...) }

	add(
		// node-1: managed, Ready, EBS and GCE PD migrated to CSI.
		guardNode("node-1", true, true, inUse(csiName("h-rwo"), iscsiName, "kubernetes.io/csi/"+guardEBSDriver+"^vol-0inline"),
			listsAttached(csiName("h-rwo"), csiName("h-done")), func(n *v1.Node) {
				n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: iscsiName,
					DevicePath: "/dev/disk/by-path/ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:storage-lun-0"})
			}),
		// node-2: managed, NotReady and out of service, no CSINode: a
		// migratable volume can't be decided there.
		guardNode("node-2", true, false, outOfService, inUse(csiName("h-n2"))),
		// node-3: its kubelet attaches.
		guardNode("node-3", false, true),
		// node-4: managed, Ready, with an attachment nobody wants.
		guardNode("node-4", true, true, listsAttached(csiName("h-orphan"))),
		&storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-1",
			Annotations: map[string]string{"storage.alpha.kubernetes.io/migrated-plugins": "kubernetes.io/aws-ebs,kubernetes.io/gce-pd"}},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
				{Name: guardEBSDriver, NodeID: "i-node-1"}, {Name: guardGCEDriver, NodeID: "node-1"}, {Name: driver, NodeID: "node-1"}}}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: driver}, Spec: storagev1.CSIDriverSpec{AttachRequired: new(true)}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: guardNoAttachDriver}, Spec: storagev1.CSIDriverSpec{AttachRequired: new(false)}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: guardInlineDriver}, Spec: storagev1.CSIDriverSpec{AttachRequired: new(true)}},
	)

	// A claim bound to a CSI PV of the given modes, used by pods.
	bound := func(claim, handle, drv string, mode v1.PersistentVolumeMode, modes ...v1.PersistentVolumeAccessMode) {
		c := guardClaim(claim, "pv-"+claim, mode, nil)
		add(c, guardPV("pv-"+claim, guardCSISource(drv, handle), c, modes...))
	}
	bound("claim-rwo", "h-rwo", driver, fs, rwo)
	bound("claim-rwx", "h-rwx", driver, fs, rwx)
	bound("claim-rox", "h-rox", driver, fs, rox)
	bound("claim-rwo-rox", "h-rwo-rox", driver, fs, rwo, rox)
	bound("claim-block", "h-block", driver, block, rwo)
	bound("claim-noattach", "h-noattach", guardNoAttachDriver, fs, rwo)
	bound("claim-done", "h-done", driver, fs, rwo)
	bound("claim-delrun", "h-delrun", driver, fs, rwo)
	bound("claim-delstop", "h-delstop", driver, fs, rwo)
	bound("claim-unmanaged", "h-unmanaged", driver, fs, rwo)
	bound("claim-n2", "h-n2", driver, fs, rwo)
	bound("claim-nomodes", "h-nomodes", driver, fs)
	add(guardPod("pod-rwo", "node-1", claimVolume("data", "claim-rwo")),
		// The same RWO volume wanted on another node: Multi-Attach.
		guardPod("pod-rwo-b", "node-4", claimVolume("data", "claim-rwo")),
		guardPod("pod-rwx", "node-1", claimVolume("data", "claim-rwx")),
		guardPod("pod-rwx-b", "node-4", claimVolume("data", "claim-rwx")),
		guardPod("pod-rox", "node-1", claimVolume("data", "claim-rox")),
		guardPod("pod-rox-b", "node-4", claimVolume("data", "claim-rox")),
		guardPod("pod-rwo-rox", "node-1", claimVolume("data", "claim-rwo-rox")),
		guardPod("pod-rwo-rox-b", "node-4", claimVolume("data", "claim-rwo-rox")),
		guardPod("pod-nomodes", "node-1", claimVolume("data", "claim-nomodes")),
		guardPod("pod-nomodes-b", "node-4", claimVolume("data", "claim-nomodes")),
		guardPod("pod-noattach", "node-1", claimVolume("data", "claim-noattach")),
		guardPod("pod-unmanaged", "node-3", claimVolume("data", "claim-unmanaged")),
		guardPod("pod-n2", "node-2", claimVolume("data", "claim-n2"),
			v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0n2"}}}),
	)
	blockPod := guardPod("pod-block", "node-1", claimVolume("data", "claim-block"))
	blockPod.Spec.Containers[0].VolumeDevices = []v1.VolumeDevice{{Name: "data", DevicePath: "/dev/xvda"}}
	add(blockPod)

	// Terminated and terminating pods.
	done := guardPod("pod-done", "node-1", claimVolume("data", "claim-done"))
	done.Status.Phase = v1.PodSucceeded
	done.Status.ContainerStatuses[0].State = stateTerminated()
	delRun := guardPod("pod-delrun", "node-1", claimVolume("data", "claim-delrun"))
	delRun.DeletionTimestamp, delRun.DeletionGracePeriodSeconds = &guardTime, new(int64(30))
	delRun.Status.ContainerStatuses = append(delRun.Status.ContainerStatuses, v1.ContainerStatus{Name: "sidecar", State: stateTerminated()})
	delRun.Status.EphemeralContainerStatuses = []v1.ContainerStatus{{Name: "debug", State: stateWaiting()}}
	delStop := guardPod("pod-delstop", "node-1", claimVolume("data", "claim-delstop"))
	delStop.DeletionTimestamp = &guardTime
	delStop.Status.ContainerStatuses[0].State = stateTerminated()
	delStop.Status.ContainerStatuses = append(delStop.Status.ContainerStatuses, v1.ContainerStatus{Name: "sidecar", State: stateWaiting()})
	// A deleting pod whose last running container is an ephemeral one.
	delEph := guardPod("pod-deleph", "node-1", claimVolume("data", "claim-delstop"))
	delEph.DeletionTimestamp = &guardTime
	delEph.Status.ContainerStatuses[0].State = stateTerminated()
	delEph.Status.EphemeralContainerStatuses = []v1.ContainerStatus{{Name: "debug", State: stateRunning()}}
	// One whose last container not terminated is an ephemeral one, waiting.
	delEphWait := guardPod("pod-delephwait", "node-4", claimVolume("data", "claim-rwx"))
	delEphWait.DeletionTimestamp = &guardTime
	delEphWait.Status.ContainerStatuses[0].State = stateTerminated()
	delEphWait.Status.EphemeralContainerStatuses = []v1.ContainerStatus{{Name: "debug", State: stateWaiting()}}
	// And one whose init container still runs.
	delInit := guardPod("pod-delinit", "node-4", claimVolume("data", "claim-delrun"))
	delInit.DeletionTimestamp = &guardTime
	delInit.Status.InitContainerStatuses[0].State = stateRunning()
	delInit.Status.ContainerStatuses[0].State = stateWaiting()
	failed := guardPod("pod-failed", "node-4", claimVolume("data", "claim-done"))
	failed.Status.Phase = v1.PodFailed
	add(done, delRun, delStop, delEph, delEphWait, delInit, failed,
		guardPod("pod-unscheduled", "", claimVolume("data", "claim-rwo")),
		guardPod("pod-nonode", "node-9", claimVolume("data", "claim-rwo")))

	// Two pods created while the controller was down race for one RWO
	// volume: a restart reads the newest first, and it wins.
	bound("claim-race", "h-race", driver, fs, rwo)
	raceA, raceB := guardPod("pod-race-a", "node-1", claimVolume("data", "claim-race")),
		guardPod("pod-race-b", "node-4", claimVolume("data", "claim-race"))
	raceB.CreationTimestamp = metav1.NewTime(guardTime.Add(time.Minute))
	add(raceA, raceB)

	// Generic ephemeral volumes: a claim the pod controls, a claim of that
	// name the pod does not (created by a user, or left by an earlier pod
	// of the same name), one the pod owns without controlling it, and one
	// not bound yet.
	eph := guardPod("pod-eph", "node-1", ephemeralVolume("scratch", fs))
	ephClaim := guardClaim("pod-eph-scratch", "pv-eph", fs, eph)
	add(eph, ephClaim, guardPV("pv-eph", guardCSISource(driver, "h-eph"), ephClaim, rwo))
	foreign := guardPod("pod-eph-foreign", "node-1", ephemeralVolume("scratch", fs))
	foreignClaim := guardClaim("pod-eph-foreign-scratch", "pv-eph-foreign", fs, nil)
	add(foreign, foreignClaim, guardPV("pv-eph-foreign", guardCSISource(driver, "h-eph-foreign"), foreignClaim, rwo))
	stale := guardPod("pod-eph-stale", "node-1", ephemeralVolume("scratch", block))
	staleClaim := guardClaim("pod-eph-stale-scratch", "pv-eph-stale", block, guardPod("pod-eph-stale", "node-1"))
	staleClaim.OwnerReferences[0].UID = "uid-earlier-pod-eph-stale"
	add(stale, staleClaim, guardPV("pv-eph-stale", guardCSISource(driver, "h-eph-stale"), staleClaim, rwo))
	owned := guardPod("pod-eph-owned", "node-1", ephemeralVolume("scratch", fs))
	ownedClaim := guardClaim("pod-eph-owned-scratch", "pv-eph-owned", fs, owned)
	ownedClaim.OwnerReferences[0].Controller = new(false)
	add(owned, ownedClaim, guardPV("pv-eph-owned", guardCSISource(driver, "h-eph-owned"), ownedClaim, rwo))
	ephBlock := guardPod("pod-eph-block", "node-4", ephemeralVolume("scratch", block))
	ephBlockClaim := guardClaim("pod-eph-block-scratch", "pv-eph-block", block, ephBlock)
	add(ephBlock, ephBlockClaim, guardPV("pv-eph-block", guardCSISource(driver, "h-eph-block"), ephBlockClaim, rwo))
	pending := guardPod("pod-eph-pending", "node-1", ephemeralVolume("scratch", fs))
	add(pending, guardClaim("pod-eph-pending-scratch", "", fs, pending))

	// Claims not ready: unbound; bound by the claim's side only (its PV is
	// bound to an earlier claim of that name); missing; pointing to a PV
	// that does not exist.
	unbound := guardClaim("claim-unbound", "", fs, nil)
	half := guardClaim("claim-half", "pv-half", fs, nil)
	earlier := guardClaim("claim-half", "", fs, nil)
	earlier.UID = "uid-earlier-claim-half"
	add(unbound, half, guardPV("pv-half", guardCSISource(driver, "h-half"), earlier, rwo),
		guardClaim("claim-nopv", "pv-missing", fs, nil),
		guardPod("pod-waiting", "node-1", claimVolume("a", "claim-unbound"), claimVolume("b", "claim-half"),
			claimVolume("c", "claim-missing"), claimVolume("d", "claim-nopv")))

	// Inline volumes: CSI (never attached), in-tree migrated (EBS, in its
	// URL form, GCE PD), iSCSI and FC, and what has nothing to attach.
	inlineEBS := v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{
		VolumeID: "aws://us-east-1a/vol-0inline", FSType: "xfs", Partition: 1}}}
	iscsi := v1.Volume{Name: "iscsi", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{
		TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:storage", Lun: 0, FSType: "ext4", ISCSIInterface: "default"}}}
	add(guardPod("pod-inline", "node-1",
		v1.Volume{Name: "csi", VolumeSource: v1.VolumeSource{CSI: &v1.CSIVolumeSource{Driver: guardInlineDriver,
			VolumeAttributes: map[string]string{"size": "1Gi"}}}},
		inlineEBS,
		v1.Volume{Name: "gce", VolumeSource: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "pd-inline", FSType: "ext4"}}},
		v1.Volume{Name: "azure", VolumeSource: v1.VolumeSource{AzureDisk: &v1.AzureDiskVolumeSource{DiskName: "d",
			DataDiskURI: "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/disks/d"}}},
		v1.Volume{Name: "file", VolumeSource: v1.VolumeSource{AzureFile: &v1.AzureFileVolumeSource{SecretName: "s", ShareName: "share"}}},
		iscsi,
		v1.Volume{Name: "fc", VolumeSource: v1.VolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: []string{"500a0982991b8dc5"}, Lun: new(int32(2))}}},
		v1.Volume{Name: "cm", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
		v1.Volume{Name: "secret", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "s"}}},
		v1.Volume{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
		v1.Volume{Name: "host", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/log"}}},
		v1.Volume{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{}}},
		v1.Volume{Name: "nfs", VolumeSource: v1.VolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs", Path: "/"}}},
	))

	// Migrated in-tree PVs: EBS, and GCE PD whose zone label makes its CSI
	// handle; iSCSI and FC PVs attached in-tree.
	ebsClaim := guardClaim("claim-ebs", "pv-ebs", fs, nil)
	gceClaim := guardClaim("claim-gce", "pv-gce", fs, nil)
	gcePV := guardPV("pv-gce", v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "pd-1", FSType: "ext4"}}, gceClaim, rwo)
	gcePV.Labels["topology.kubernetes.io/zone"] = "europe-west1-b"
	gcePV.Labels["topology.kubernetes.io/region"] = "europe-west1"
	gcePV.Spec.NodeAffinity = &v1.VolumeNodeAffinity{Required: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchExpressions: []v1.NodeSelectorRequirement{{Key: "topology.kubernetes.io/zone", Operator: v1.NodeSelectorOpIn, Values: []string{"europe-west1-b"}}}}}}}
	fcClaim := guardClaim("claim-fc", "pv-fc", block, nil)
	iscsiClaim := guardClaim("claim-iscsi", "pv-iscsi", fs, nil)
	add(ebsClaim, guardPV("pv-ebs", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0pv", FSType: "ext4"}}, ebsClaim, rwo),
		gceClaim, gcePV, fcClaim,
		guardPV("pv-fc", v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{WWIDs: []string{"3600508b400105e210000900000490000"}}}, fcClaim, rwo),
		iscsiClaim,
		guardPV("pv-iscsi", v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{TargetPortal: "10.0.0.2:3260",
			IQN: "iqn.2001-04.com.example:pv", Lun: 1, ReadOnly: true}}, iscsiClaim, rwx),
		guardPod("pod-migrated", "node-1", claimVolume("ebs", "claim-ebs"), claimVolume("gce", "claim-gce")),
		guardPod("pod-intree", "node-4", claimVolume("fc", "claim-fc"), claimVolume("iscsi", "claim-iscsi")),
	)

	// What is attached: VolumeAttachments, one of a PV now gone, one with
	// an attach error; node.status.volumesAttached on node-1 and node-4.
	translated, err := csitrans.New().TranslateInTreeInlineVolumeToCSI(klog.Background(), &inlineEBS, ns)
	if err != nil {
		t.Fatal(err)
	}
	add(guardVA("pv-claim-rwo", "h-rwo", driver, "node-1", nil),
		guardVA("pv-claim-done", "h-done", driver, "node-1", nil),
		guardVA("", "vol-0inline", guardEBSDriver, "node-1", &translated.Spec),
		guardVA("pv-claim-n2", "h-n2", driver, "node-2", nil),
		guardVA("pv-orphan", "h-orphan", driver, "node-4", nil),
		guardVA("pv-claim-delrun", "h-delrun", driver, "node-1", nil, attachError("rpc error: timeout")),
		guardVA("pv-ebs", "vol-0pv", guardEBSDriver, "node-1", nil, vaDeleting),
	)
	orphanClaim := guardClaim("claim-orphan", "pv-orphan", fs, nil)
	add(guardPV("pv-orphan", guardCSISource(driver, "h-orphan"), orphanClaim, rwo))
	return objs
}
