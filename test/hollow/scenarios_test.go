package hollow

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kube-attach/attach-detach-controller/test/e2e/stack"
	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// The full set (make test-hollow-full); make test runs with -short.

const (
	// awsEBSPlugin is the in-tree plugin kubelet lists as migrated to
	// stack.EBSDriver in its CSINode.
	awsEBSPlugin = "kubernetes.io/aws-ebs"
	// migratedPluginsAnnotation is where kubelet lists them.
	migratedPluginsAnnotation = "storage.alpha.kubernetes.io/migrated-plugins"
	// noAttachDriver is a CSI driver whose CSIDriver says attachRequired
	// false.
	noAttachDriver = "noattach.csi.example.com"
	// settle is how long a "nothing changes" check watches: more than a
	// kubelet status cycle (10 s).
	settle = 15 * time.Second
)

func fullSet(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("in the full set: make test-hollow-full")
	}
}

// TestSeveralVolumes: one pod, three volumes, each attached, listed under
// kubelet's name and mounted; all detached after the pod is deleted.
func TestSeveralVolumes(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "several", 1)
		node := e.node(0)
		vols := []csiVolume{e.createVolume("a"), e.createVolume("b"), e.createVolume("c")}
		var claims []string
		var attach, detach []step
		for _, v := range vols {
			claims = append(claims, v.claim)
			attach = append(attach, e.vaAttached(v, node), e.listedAttached(v, node, true))
			detach = append(detach, e.vaGone(v, node), e.listedAttached(v, node, false))
		}
		start := time.Now()
		e.createPod("app", node, claims...)
		e.waitSteps("pod created", start, nil, append(attach, e.podRunning("app"))...)
		e.checkNames()
		e.checkKubeletLogs()
		start = time.Now()
		e.deletePod("app")
		e.waitSteps("pod deleted", start, nil, append(detach, e.podGone("app"))...)
	})
}

// TestRWXOnTwoNodes: a ReadWriteMany volume attached to two nodes at once,
// each kubelet mounting it.
func TestRWXOnTwoNodes(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "rwx", 2)
		v := e.createVolume("shared", v1.ReadWriteMany)
		start := time.Now()
		e.createPod("a", e.node(0), v.claim)
		e.createPod("b", e.node(1), v.claim)
		e.waitSteps("pods created", start, nil,
			e.vaAttached(v, e.node(0)), e.vaAttached(v, e.node(1)),
			e.listedAttached(v, e.node(0), true), e.listedAttached(v, e.node(1), true),
			e.podRunning("a"), e.podRunning("b"),
		)
		e.checkNames()
		e.checkKubeletLogs()
	})
}

// TestNoAttachRequired: a CSI driver whose CSIDriver says attachRequired
// false: no VolumeAttachment, nothing in volumesAttached, the pod runs.
func TestNoAttachRequired(t *testing.T) {
	fullSet(t)
	if _, err := framework.CreateCSIDriver(t.Context(), st.Cluster.Client, noAttachDriver, new(false)); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "noattach", 1, func(_ int, o *stack.HollowNodeOptions) {
			o.Drivers = append(append(o.Drivers, st.Drivers...), noAttachDriver)
			o.NoAttachDrivers = []string{noAttachDriver}
		})
		node := e.node(0)
		v := csiVolume{claim: "data", driver: noAttachDriver, handle: e.ns + "-data"}
		pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, v.claim, framework.CSISource(v.driver, v.handle))
		if err != nil {
			t.Fatal(err)
		}
		v.pv = pv.Name
		start := time.Now()
		e.createPod("app", node, v.claim)
		e.waitSteps("pod created", start, nil, e.podRunning("app"))
		framework.Consistently(t, settle, func() error {
			if _, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("VolumeAttachment %s for a driver that needs no attach: %v", v.vaName(node), err)
			}
			n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
			if err == nil && attached(n, v.name()) {
				return fmt.Errorf("node %s lists %s in volumesAttached", node, v.name())
			}
			return err
		}, "no attachment of %s", v.name())
		e.checkKubeletLogs()
	})
}

// TestMigratedEBS: in-tree AWS EBS volumes, a PV on one node and an inline
// pod volume on another, on nodes whose kubelet registered ebs.csi.aws.com
// and lists kubernetes.io/aws-ebs as migrated in the CSINode it writes: the
// controller attaches them through CSI, under the CSI names kubelet uses.
func TestMigratedEBS(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "ebs", 2)
		for _, n := range e.nodes {
			csiNode, err := e.client.StorageV1().CSINodes().Get(e.ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(csiNode.Annotations[migratedPluginsAnnotation], awsEBSPlugin) {
				t.Fatalf("CSINode %s written by kubelet: %s = %q, want %s in it", n.Name, migratedPluginsAnnotation, csiNode.Annotations[migratedPluginsAnnotation], awsEBSPlugin)
			}
		}
		suffix := e.ns[len(e.ns)-4:]
		pvID, inlineID := "vol-0a"+suffix, "vol-0b"+suffix
		src := v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: pvID, FSType: "ext4"}}
		pv, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, "legacy", src)
		if err != nil {
			t.Fatal(err)
		}
		byPV := csiVolume{claim: "legacy", pv: pv.Name, driver: stack.EBSDriver, handle: pvID}
		inline := csiVolume{driver: stack.EBSDriver, handle: inlineID}

		start := time.Now()
		e.createPod("pv", e.node(0), byPV.claim)
		e.createPodWithVolumes("inline", e.node(1), v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{
			AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: inlineID, FSType: "ext4"},
		}})
		e.waitSteps("pods created", start, nil,
			e.vaAttached(byPV, e.node(0)), e.listedAttached(byPV, e.node(0), true), e.listedInUse(byPV, e.node(0), true),
			e.vaAttached(inline, e.node(1)), e.listedAttached(inline, e.node(1), true), e.listedInUse(inline, e.node(1), true),
			e.podRunning("pv"), e.podRunning("inline"),
		)
		e.checkNames()
		e.checkKubeletLogs()
		start = time.Now()
		e.deletePod("pv")
		e.deletePod("inline")
		e.waitSteps("pods deleted", start, nil,
			e.vaGone(byPV, e.node(0)), e.vaGone(inline, e.node(1)),
			e.podGone("pv"), e.podGone("inline"),
		)
	})
}

// TestISCSIAndFCNames: in-tree iSCSI and FC volumes, attached by the
// controller alone (no VolumeAttachment): kubelet's own plugins confirm the
// attach under the name the controller wrote in volumesAttached ("Controller
// attach succeeded"). The mount itself then fails: no iscsiadm, no FC disk.
func TestISCSIAndFCNames(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "iscsi", 1)
		node := e.node(0)
		iscsi := v1.PersistentVolumeSource{ISCSI: &v1.ISCSIPersistentVolumeSource{
			TargetPortal: "10.0.0.1:3260", IQN: "iqn.2001-04.com.example:" + e.ns, Lun: 0, FSType: "ext4",
		}}
		// Names of this run only: the other controller's run left its
		// pods and attachments on nodes since stopped.
		suffix := e.ns[len(e.ns)-4:]
		wwns := []string{"500a09818910" + suffix, "500a09818911" + suffix}
		fc := v1.PersistentVolumeSource{FC: &v1.FCVolumeSource{TargetWWNs: wwns, Lun: new(int32(2)), FSType: "ext4"}}
		for claim, src := range map[string]v1.PersistentVolumeSource{"iscsi": iscsi, "fc": fc} {
			if _, _, err := framework.CreateBoundPVC(e.ctx, e.client, e.ns, claim, src); err != nil {
				t.Fatal(err)
			}
		}
		iscsiName := v1.UniqueVolumeName("kubernetes.io/iscsi/10.0.0.1:3260:iqn.2001-04.com.example:" + e.ns + ":0")
		// Every target WWN, as Go prints a slice (kubelet's fc plugin:
		// fmt.Sprintf("%v:%v", TargetWWNs, *Lun)), not only the first.
		fcName := v1.UniqueVolumeName("kubernetes.io/fc/[" + wwns[0] + " " + wwns[1] + "]:2")
		start := time.Now()
		e.createPod("app", node, "iscsi", "fc")
		e.waitSteps("pod created", start, nil,
			e.listedAttachedName(iscsiName, node, true), e.listedInUseName(iscsiName, node, true), e.kubeletConfirmed(0, iscsiName),
			e.listedAttachedName(fcName, node, true), e.listedInUseName(fcName, node, true), e.kubeletConfirmed(0, fcName),
		)
		e.checkNames()
	})
}

// kubeletConfirmed: node i's kubelet found name in volumesAttached.
func (e *env) kubeletConfirmed(i int, name v1.UniqueVolumeName) step {
	return step{"kubelet of " + e.node(i) + " confirms the attach of " + string(name), func() (bool, error) {
		log, err := e.nodes[i].KubeletLog()
		if err != nil {
			return false, err
		}
		for line := range strings.Lines(log) {
			if strings.Contains(line, "Controller attach succeeded") && strings.Contains(line, string(name)) {
				return true, nil
			}
		}
		return false, nil
	}}
}

// stillAttached fails as soon as v is no longer attached to node and
// listed there, or the pod is no longer Running.
func (e *env) stillAttached(v csiVolume, node, pod string) func() error {
	return func() error {
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("VolumeAttachment %s: %w", v.vaName(node), err)
		}
		if !va.Status.Attached || va.DeletionTimestamp != nil {
			return fmt.Errorf("VolumeAttachment %s detached or being deleted", va.Name)
		}
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !attached(n, v.name()) {
			return fmt.Errorf("node %s no longer lists %s", node, v.name())
		}
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, pod, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning {
			return fmt.Errorf("pod %s is %s", pod, p.Status.Phase)
		}
		return nil
	}
}

// TestKubeletRestart: a kubelet restarted while its pod runs: nothing is
// detached, the pod stays Running, the kubelet reports the volume in use
// again and does not complain.
func TestKubeletRestart(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "kubelet", 1)
		node := e.node(0)
		v := e.createVolume("data")
		start := time.Now()
		e.createPod("app", node, v.claim)
		e.waitSteps("pod created", start, nil, e.vaAttached(v, node), e.listedAttached(v, node, true), e.podRunning("app"))

		held := e.stillAttached(v, node, "app")
		if err := e.nodes[0].StopKubelet(); err != nil {
			t.Fatal(err)
		}
		if err := held(); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := e.nodes[0].StartKubelet(e.ctx); err != nil {
			t.Fatal(err)
		}
		mark := e.mark()
		e.waitSteps("kubelet restarted", start, held, e.listedInUse(v, node, true))
		framework.Consistently(t, settle, held, "%s attached to %s and pod app Running", v.name(), node)
		e.checkNames()
		e.checkKubeletLogsSince(mark)
	})
}

// TestControllerRestart: the controller restarted while pods run detaches
// nothing, and serves a new pod afterwards.
func TestControllerRestart(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "restart", 2)
		v := e.createVolume("data")
		start := time.Now()
		e.createPod("app", e.node(0), v.claim)
		e.waitSteps("pod created", start, nil, e.vaAttached(v, e.node(0)), e.listedAttached(v, e.node(0), true), e.podRunning("app"))

		held := e.stillAttached(v, e.node(0), "app")
		start = time.Now()
		e.restartController()
		e.waitSteps("controller restarted", start, held, e.podRunning("app"))
		framework.Consistently(t, settle, held, "%s attached to %s and pod app Running", v.name(), e.node(0))

		w := e.createVolume("later")
		start = time.Now()
		e.createPod("later", e.node(1), w.claim)
		e.waitSteps("pod created after the restart", start, held, e.vaAttached(w, e.node(1)), e.listedAttached(w, e.node(1), true), e.podRunning("later"))
		e.checkNames()
		e.checkKubeletLogs()
	})
}

// vaHeld fails as soon as v's VolumeAttachment on node is gone, detached
// or being deleted.
func (e *env) vaHeld(v csiVolume, node string) func() error {
	return func() error {
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, v.vaName(node), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("VolumeAttachment %s: %w", v.vaName(node), err)
		}
		if !va.Status.Attached || va.DeletionTimestamp != nil {
			return fmt.Errorf("VolumeAttachment %s detached or being deleted", va.Name)
		}
		return nil
	}
}

// TestNodeDeletedAndReRegistered: the Node object of a running kubelet is
// deleted. Kubelet v1.37 registers a Node only at its start (it then fails
// every status update), so the node's kubelet is restarted, as an operator
// or its supervisor does: it registers the Node again (a new UID, empty
// status). Nothing is detached meanwhile, and the new Node lists the volume
// again in volumesAttached (controller) and volumesInUse (kubelet).
func TestNodeDeletedAndReRegistered(t *testing.T) {
	fullSet(t)
	forEachController(t, func(t *testing.T, kind controllerKind) {
		e := newEnv(t, kind, "renode", 1)
		node := e.node(0)
		v := e.createVolume("data")
		start := time.Now()
		e.createPod("app", node, v.claim)
		e.waitSteps("pod created", start, nil, e.vaAttached(v, node), e.listedAttached(v, node, true), e.podRunning("app"))

		held := e.vaHeld(v, node)
		start = time.Now()
		if err := e.client.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := e.nodes[0].StopKubelet(); err != nil {
			t.Fatal(err)
		}
		if err := held(); err != nil {
			t.Fatal(err)
		}
		if err := e.nodes[0].StartKubelet(e.ctx); err != nil {
			t.Fatal(err)
		}
		e.waitSteps("node deleted and registered again", start, held,
			e.listedAttached(v, node, true),
			e.listedInUse(v, node, true),
			e.podRunning("app"),
		)
		framework.Consistently(t, settle, held, "%s attached to %s", v.name(), node)
		e.checkNames()
	})
}
