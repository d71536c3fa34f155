package kubectladc

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const driver = "adc.kubectl.test"

// setup creates a namespace and a managed, Ready node with driver
// installed, both named after the test.
func setup(ctx context.Context, t *testing.T, name string) (ns, node string) {
	t.Helper()
	ns, node = "ns-"+name, "node-"+name
	if _, err := framework.CreateNamespace(ctx, cluster.Client, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreateNode(ctx, cluster.Client, framework.Node(node)); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreateCSINode(ctx, cluster.Client, node, []storagev1.CSINodeDriver{framework.CSINodeDriver(driver, node)}); err != nil {
		t.Fatal(err)
	}
	return ns, node
}

// TestWhyFromObjects: without a controller to ask (no Lease), the answer
// follows the chain in the objects: an attached, reported and mounted
// volume; one whose attach the driver refused; a claim not bound.
func TestWhyFromObjects(t *testing.T) {
	ctx := context.Background()
	ns, node := setup(ctx, t, "objects")
	handle := "vol-objects"
	pv, _, err := framework.CreateBoundPVC(ctx, cluster.Client, ns, "data", framework.CSISource(driver, handle))
	if err != nil {
		t.Fatal(err)
	}
	failing, _, err := framework.CreateBoundPVC(ctx, cluster.Client, ns, "failing", framework.CSISource(driver, "vol-refused"))
	if err != nil {
		t.Fatal(err)
	}
	pending := framework.PVC(ns, "pending", "")
	if _, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreatePod(ctx, cluster.Client, ns, "web", node, "data", "failing"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreatePod(ctx, cluster.Client, ns, "unbound", node, "pending"); err != nil {
		t.Fatal(err)
	}
	// What the controller, the external-attacher and kubelet would have
	// written.
	name := framework.VolumeAttachmentName(handle, driver, node)
	createVA(ctx, t, name, pv.Name, node, storagev1.VolumeAttachmentStatus{Attached: true})
	refused := framework.VolumeAttachmentName("vol-refused", driver, node)
	createVA(ctx, t, refused, failing.Name, node, storagev1.VolumeAttachmentStatus{
		AttachError: &storagev1.VolumeError{Message: "rpc error: disk is busy"},
	})
	volName := framework.CSIVolumeName(driver, handle)
	patchNodeStatus(ctx, t, node, fmt.Sprintf(`{"status":{"volumesAttached":[{"name":%q,"devicePath":""}],"volumesInUse":[%q]}}`, volName, volName))

	t.Run("attached", func(t *testing.T) {
		out := adc(t, "why", "pod/web", "-n", ns, "--lease", "no-such-lease")
		wantLines(t, out,
			"pod "+ns+"/web on node "+node,
			"Answered from the objects, not by the controller: no Lease kube-system/no-such-lease",
			`volume "vol-0": claim data -> PersistentVolume `+pv.Name+" -> "+volName+" (single-node)",
			"CSINode "+node+" lists driver "+driver,
			"VolumeAttachment "+name+" on node "+node+": attached",
			"node "+node+": in status.volumesAttached as "+volName+"; in status.volumesInUse (mounted)",
			"=> attached, reported and mounted",
			`volume "vol-1": claim failing -> PersistentVolume `+failing.Name,
			"VolumeAttachment "+refused+" on node "+node+": not attached; attach error: rpc error: disk is busy",
			"=> the driver failed to attach it: rpc error: disk is busy",
			"Not known without the controller",
		)
	})
	t.Run("claim not bound", func(t *testing.T) {
		out := adc(t, "why", "unbound", "-n", ns, "--client-side")
		wantLines(t, out,
			"Answered from the objects, not by the controller: it was not asked (--client-side)",
			`volume "vol-0": claim pending`,
			"=> claim "+ns+"/pending is Pending, not bound to a PersistentVolume",
		)
	})
	t.Run("pv", func(t *testing.T) {
		out := adc(t, "why", "pv/"+pv.Name, "--client-side")
		wantLines(t, out,
			"PersistentVolume "+pv.Name+" (claim "+ns+"/data)",
			"VolumeAttachment "+name+" on node "+node+": attached",
			"node "+node+": in status.volumesAttached: true; in status.volumesInUse: true",
			"pod "+ns+"/web:",
			"=> attached, reported and mounted",
		)
	})
	t.Run("node", func(t *testing.T) {
		out := adc(t, "why", "node/"+node, "--client-side")
		wantLines(t, out,
			"node "+node,
			"Ready: true; managed",
			"CSINode drivers: "+driver,
			"VolumeAttachment "+refused+": not attached; attach error",
			"pod "+ns+"/unbound:",
			"is Pending, not bound",
			"pod "+ns+"/web:",
			"=> attached, reported and mounted",
		)
	})
	t.Run("a Lease whose holder is gone", func(t *testing.T) {
		lease := "adc-kubectl-gone"
		createLease(ctx, t, lease, "gone-pod_1234")
		out := adc(t, "why", "pod/web", "-n", ns, "--lease", lease)
		wantLines(t, out, "Answered from the objects, not by the controller: leader pod kube-system/gone-pod", "=> attached, reported and mounted")
	})
	t.Run("a leader with no kubelet to forward a port to", func(t *testing.T) {
		// The port-forward is tried through the API server, which finds no
		// kubelet to reach on the leader's node.
		lease, leader := "adc-kubectl-pf", "adc-leader-pf"
		if _, err := cluster.Client.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, framework.Pod(metav1.NamespaceSystem, leader, node), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		createLease(ctx, t, lease, leader+"_5678")
		out := adc(t, "why", "pod/web", "-n", ns, "--lease", lease)
		wantLines(t, out, "Answered from the objects, not by the controller: port-forward to kube-system/"+leader, "=> attached, reported and mounted")
	})
}

// TestWhyFromController: the controller binary attaches a pod's volume;
// kubectl adc asks its /explain at --endpoint, verifying the controller's
// certificate, with the kubeconfig's credentials. The way the plugin
// reaches a leader in a cluster, a port-forward through the API server,
// needs a kubelet, which this stack has not.
func TestWhyFromController(t *testing.T) {
	ctx := context.Background()
	ns, node := setup(ctx, t, "controller")
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{driver}})
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	framework.StartControllerT(t, framework.ControllerOptions{
		Binary:     controller,
		Kubeconfig: cluster.Kubeconfig,
		Args: []string{
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--cert-dir=" + certDir,
			"-v=2",
		},
	})
	handle := "vol-asked"
	pv, _, err := framework.CreateBoundPVC(ctx, cluster.Client, ns, "data", framework.CSISource(driver, handle))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := framework.CreatePod(ctx, cluster.Client, ns, "web", node, "data"); err != nil {
		t.Fatal(err)
	}
	volName := framework.CSIVolumeName(driver, handle)
	framework.Eventually(t, time.Minute, func() (bool, error) {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, a := range n.Status.VolumesAttached {
			if string(a.Name) == volName {
				return true, nil
			}
		}
		return false, nil
	}, "the controller reports %s attached to %s", volName, node)

	endpoint := []string{"--endpoint", "https://127.0.0.1:" + strconv.Itoa(port), "--endpoint-ca", filepath.Join(certDir, "attach-detach-controller.crt")}
	t.Run("pod", func(t *testing.T) {
		out := adc(t, append([]string{"why", "pod/web", "-n", ns}, endpoint...)...)
		wantLines(t, out,
			"pod "+ns+"/web on node "+node,
			"Answered by the controller (https://127.0.0.1:",
			volName+" on node "+node,
			"state:  attached, reported in the node's status.volumesAttached",
			"wanted: wanted by "+ns+"/web",
			"next:   nothing",
			"how:    csi ("+driver+"), decided by PersistentVolume "+pv.Name,
		)
	})
	t.Run("pv", func(t *testing.T) {
		out := adc(t, append([]string{"why", "pv/" + pv.Name}, endpoint...)...)
		wantLines(t, out, "Answered by the controller", volName+" on node "+node, "state:  attached")
	})
	t.Run("node", func(t *testing.T) {
		out := adc(t, append([]string{"why", "node/" + node}, endpoint...)...)
		wantLines(t, out, "Answered by the controller", volName+" on node "+node, "wanted: wanted by "+ns+"/web")
	})
	t.Run("an unbound claim", func(t *testing.T) {
		if _, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, framework.PVC(ns, "pending", ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := framework.CreatePod(ctx, cluster.Client, ns, "unbound", node, "pending"); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"why", "pod/unbound", "-n", ns}, endpoint...)
		framework.Eventually(t, 30*time.Second, func() (bool, error) {
			out, err := runADC(args...)
			return err == nil && containsAll(out, "Answered by the controller", `Volume "vol-0" of the pod:`, "not bound"), err
		}, "the controller says the claim of pod unbound is not bound")
		adc(t, args...)
	})
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func createVA(ctx context.Context, t *testing.T, name, pv, node string, status storagev1.VolumeAttachmentStatus) {
	t.Helper()
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
	va, err := cluster.Client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	va.Status = status
	if _, err := cluster.Client.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func patchNodeStatus(ctx context.Context, t *testing.T, node, patch string) {
	t.Helper()
	if _, err := cluster.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
}

// createLease writes a Lease held, and renewed now, by holder.
func createLease(ctx context.Context, t *testing.T, name, holder string) {
	t.Helper()
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: name},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: new(int32(3600)),
			AcquireTime:          &now,
			RenewTime:            &now,
		},
	}
	if _, err := cluster.Client.CoordinationV1().Leases(metav1.NamespaceSystem).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
