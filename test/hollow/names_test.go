package hollow

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

// TestNameMismatchIsCaught plants what the name checks must catch: a
// controller that lists an attached volume in node.status.volumesAttached
// under another name than kubelet's. The test plays that controller (no
// controller runs): it creates the VolumeAttachment, which the real
// external-attacher attaches, and lists the volume as
// kubernetes.io/csi/<driver>/<handle> instead of <driver>^<handle>. The pod
// must not run and checkNames must fail; once the name is written as
// kubelet spells it, the pod runs and checkNames passes.
//
// Kubelet v1.37 logs nothing about it at -v=2: it only retries
// VerifyControllerAttachedVolume (logged from -v=5). The name check reads
// node status, not the log.
func TestNameMismatchIsCaught(t *testing.T) {
	e := newEnv(t, noController, "names", 1)
	node := e.node(0)
	v := e.createVolume("data")
	e.createPod("app", node, v.claim)

	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: v.vaName(node)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: v.driver,
			NodeName: node,
			Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &v.pv},
		},
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wrong := v1.UniqueVolumeName("kubernetes.io/csi/" + v.driver + "/" + v.handle)
	e.setVolumesAttached(node, wrong)
	e.waitSteps("misnamed", time.Now(), nil,
		e.vaAttached(v, node),
		e.listedInUse(v, node, true),
	)
	// Kubelet verifies the attach as soon as it reported the volume in
	// use: a few seconds are plenty for a pod that would run.
	framework.Consistently(t, 5*time.Second, func() error {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{})
		if err == nil && p.Status.Phase == v1.PodRunning {
			return fmt.Errorf("pod Running with its volume listed as %s, not as kubelet names it (%s)", wrong, v.name())
		}
		return err
	}, "pod %s/app to wait for its volume", e.ns)
	if err := e.nameMismatch(node); err == nil {
		t.Fatalf("checkNames found nothing wrong with volumesAttached %s", wrong)
	} else {
		t.Logf("checkNames, as planted: %v", err)
	}

	e.setVolumesAttached(node, v.name())
	e.waitSteps("named as kubelet does", time.Now(), nil, e.podRunning("app"))
	e.checkNames()
}

// setVolumesAttached writes node.status.volumesAttached as a controller
// does, with a patch of the status subresource.
func (e *env) setVolumesAttached(node string, names ...v1.UniqueVolumeName) {
	e.t.Helper()
	attached := []v1.AttachedVolume{}
	for _, n := range names {
		attached = append(attached, v1.AttachedVolume{Name: n})
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"volumesAttached": attached}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if _, err := e.client.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		e.t.Fatalf("patch volumesAttached of %s: %v", node, err)
	}
}

// nameMismatch returns an error if node lists in volumesInUse a volume its
// volumesAttached does not list: once every pod of the node runs, each
// volume kubelet mounted was found there under kubelet's own unique name.
func (e *env) nameMismatch(node string) error {
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		return err
	}
	var missing []string
	for _, name := range n.Status.VolumesInUse {
		if !attached(n, name) {
			missing = append(missing, string(name))
		}
	}
	if len(missing) > 0 {
		var listed []string
		for _, a := range n.Status.VolumesAttached {
			listed = append(listed, string(a.Name))
		}
		return fmt.Errorf("node %s: kubelet uses %s, volumesAttached lists %s", node, strings.Join(missing, ", "), strings.Join(listed, ", "))
	}
	return nil
}

// checkNames fails the test on a nameMismatch of any node of the env.
func (e *env) checkNames() {
	e.t.Helper()
	for _, n := range e.nodes {
		if err := e.nameMismatch(n.Name); err != nil {
			e.t.Error(err)
		}
	}
}
