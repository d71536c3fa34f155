package migration

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/kube-attach/attach-detach-controller/test/framework"
)

const csiNodeInfoCRD = "csinodeinfos.csi.storage.k8s.io"

// deleteCSINodeInfoCRD deletes the CRD (and with it every CSINodeInfo) and
// waits until discovery no longer serves it.
func deleteCSINodeInfoCRD(ctx context.Context, t *testing.T) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(crdGVR).Delete(ctx, csiNodeInfoCRD, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete CRD %s: %v", csiNodeInfoCRD, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if _, err := dyn.Resource(crdGVR).Get(ctx, csiNodeInfoCRD, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		list, err := disc.ServerResourcesForGroupVersion(csiNodeInfoGVR.GroupVersion().String())
		if err != nil {
			return apierrors.IsNotFound(err), nil
		}
		for _, r := range list.APIResources {
			if r.Name == csiNodeInfoGVR.Resource {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("wait for CRD %s to be gone: %v", csiNodeInfoCRD, err)
	}
}

// The CSINodeInfo CRD installed after the controller started leading is
// noticed within seconds: an in-tree volume on a node whose CSINodeInfo says
// "csi" is then attached through the driver. When the CRD goes away again,
// the volume stays attached (its node no longer says how it handles the
// plugin, so the volume waits, but nothing is detached).
func TestCSINodeInfoCRDInstalledLater(t *testing.T) {
	const (
		ns     = "mig-crd-later"
		node   = "mig-crd-later-node"
		handle = "vol-crd-later"
	)
	setup(t, ns)
	ctx := t.Context()
	deleteCSINodeInfoCRD(ctx, t)
	t.Cleanup(func() {
		// Later tests expect the CRD.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := installCSINodeInfoCRD(ctx, cluster.Config); err != nil {
			t.Errorf("reinstall the CSINodeInfo CRD: %v", err)
		}
	})
	createNode(t, node)
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	ctrl := startController(t)

	createBoundPV(t, ns, "claim", ebsSource(handle))
	createPod(t, ns, "pod", node, framework.PVCVolumes("claim")...)
	// Without the CRD, only a CSINode can decide.
	msg := waitPodEvent(t, ns, "pod", v1.EventTypeWarning, "waiting for CSINode "+node)
	t.Logf("Warning without the CRD: %s", msg)

	if err := installCSINodeInfoCRD(ctx, cluster.Config); err != nil {
		t.Fatalf("install the CSINodeInfo CRD: %v", err)
	}
	createCSINodeInfo(t, node, true, "csi")
	created := time.Now()
	name := framework.VolumeAttachmentName(handle, ebsDriver, node)
	framework.Eventually(t, 20*time.Second, func() (bool, error) {
		va, err := getVA(ctx, name)
		return va != nil, err
	}, "VolumeAttachment %s once the CRD is served and the node's CSINodeInfo says csi", name)
	if latency := time.Since(created); latency >= 10*time.Second {
		t.Errorf("VolumeAttachment appeared %s after the CSINodeInfo was created, want < 10s", latency)
	} else {
		t.Logf("VolumeAttachment appeared %s after the CRD was served and the CSINodeInfo created", latency)
	}
	va := waitAttachedVA(t, name)
	if va.Spec.Attacher != ebsDriver || va.Spec.NodeName != node {
		t.Errorf("spec = {attacher %q, nodeName %q}, want {%q, %q}", va.Spec.Attacher, va.Spec.NodeName, ebsDriver, node)
	}
	csiName := framework.CSIVolumeName(ebsDriver, handle)
	waitListed(t, node, csiName, true)
	if v := ctrl.mustMetric(t, waitingMetric, nil); v != 0 {
		t.Errorf("%s = %v, want 0 once decided", waitingMetric, v)
	}

	// The CRD goes: the controller notices (the volume waits for node
	// information again) and detaches nothing.
	deleteCSINodeInfoCRD(ctx, t)
	framework.Eventually(t, 20*time.Second, func() (bool, error) {
		v, err := ctrl.metric(waitingMetric, nil)
		return v == 1, err
	}, "%s to be 1 once the CRD is gone", waitingMetric)
	framework.Consistently(t, 3*time.Second, func() error {
		va, err := getVA(ctx, name)
		switch {
		case err != nil:
			return err
		case va == nil || va.DeletionTimestamp != nil:
			return fmt.Errorf("VolumeAttachment %s deleted after the CRD went away", name)
		}
		return attachedExactly(ctx, node, csiName)
	}, "the volume stays attached without the CRD")
}

// A CSINode without the migrated-plugins annotation says nothing about
// migration: the node's CSINodeInfo decides. A CSINode with the annotation
// wins over the CSINodeInfo.
func TestCSINodeWithoutAnnotation(t *testing.T) {
	const (
		ns        = "mig-silent"
		silent    = "mig-silent-node"
		annotated = "mig-silent-annotated"
	)
	setup(t, ns)
	ctx := t.Context()
	for _, node := range []string{silent, annotated} {
		createNode(t, node)
		createCSINodeInfo(t, node, true, "csi")
	}
	drivers := []storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-"+silent)}
	if _, err := framework.CreateCSINode(ctx, cluster.Client, silent, drivers); err != nil {
		t.Fatal(err)
	}
	drivers = []storagev1.CSINodeDriver{framework.CSINodeDriver(ebsDriver, "i-"+annotated)}
	if _, err := framework.CreateCSINode(ctx, cluster.Client, annotated, drivers, "kubernetes.io/gce-pd"); err != nil {
		t.Fatal(err)
	}
	framework.StartAttacher(t, cluster.Client, framework.AttacherOptions{Drivers: []string{ebsDriver}})
	startController(t)

	createBoundPV(t, ns, "silent-claim", ebsSource("vol-silent"))
	createBoundPV(t, ns, "annotated-claim", ebsSource("vol-annotated"))
	createPod(t, ns, "silent-pod", silent, framework.PVCVolumes("silent-claim")...)
	createPod(t, ns, "annotated-pod", annotated, framework.PVCVolumes("annotated-claim")...)

	va := waitAttachedVA(t, framework.VolumeAttachmentName("vol-silent", ebsDriver, silent))
	if va.Spec.Attacher != ebsDriver || va.Spec.NodeName != silent {
		t.Errorf("spec = {attacher %q, nodeName %q}, want {%q, %q}", va.Spec.Attacher, va.Spec.NodeName, ebsDriver, silent)
	}
	waitListed(t, silent, framework.CSIVolumeName(ebsDriver, "vol-silent"), true)

	// The annotation lists other plugins only: in-tree, which this build
	// can't attach, whatever the CSINodeInfo says.
	msg := waitPodEvent(t, ns, "annotated-pod", v1.EventTypeWarning, ebsPlugin, annotated, "no attacher")
	t.Logf("Warning on the annotated node: %s", msg)
	framework.Consistently(t, 2*time.Second, func() error {
		names, err := vasOfNode(ctx, annotated)
		if err != nil {
			return err
		}
		if len(names) != 0 {
			return fmt.Errorf("VolumeAttachments %v created for a node whose CSINode says in-tree", names)
		}
		return nil
	}, "no VolumeAttachment on the annotated node")
}
