package framework

import (
	"context"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

func TestAttacher(t *testing.T) {
	const driver, ebs = "csi.test", "ebs.csi.aws.com"
	pv := func(name string, src v1.PersistentVolumeSource) *v1.PersistentVolume {
		return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: src}}
	}
	va := func(name, attacher, pv string) *storagev1.VolumeAttachment {
		return &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.VolumeAttachmentSpec{
				Attacher: attacher,
				NodeName: "node-1",
				Source:   storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
			},
		}
	}
	ebsSource := func(id string) v1.PersistentVolumeSource {
		return v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: id}}
	}
	for _, tc := range []struct {
		name string
		opts AttacherOptions
		// want is the attached state, attachError message and finalizers
		// of each VolumeAttachment; nil: left alone.
		want map[string]*storagev1.VolumeAttachment
	}{
		{
			name: "drivers, fail prefix, in-tree PV",
			opts: AttacherOptions{Drivers: []string{driver, ebs}, FailPrefix: "fail-"},
			want: map[string]*storagev1.VolumeAttachment{
				"ok":       attached(true, "", nil),
				"fail":     attached(false, AttachFailureMessage("fail-1"), nil),
				"ebs-ok":   attached(true, "", nil),
				"ebs-fail": attached(false, AttachFailureMessage("fail-ebs"), nil),
				"other":    nil,
			},
		},
		{
			name: "all drivers, finalizer",
			opts: AttacherOptions{Finalizer: true},
			want: map[string]*storagev1.VolumeAttachment{
				"ok":       attached(true, "", []string{AttacherFinalizer(driver)}),
				"fail":     attached(true, "", []string{AttacherFinalizer(driver)}),
				"ebs-ok":   attached(true, "", []string{AttacherFinalizer(ebs)}),
				"ebs-fail": attached(true, "", []string{AttacherFinalizer(ebs)}),
				"other":    attached(true, "", []string{AttacherFinalizer("other.csi.test")}),
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset([]runtime.Object{
				pv("pv-ok", CSISource(driver, "ok-1")),
				pv("pv-fail", CSISource(driver, "fail-1")),
				pv("pv-ebs-ok", ebsSource("ok-ebs")),
				pv("pv-ebs-fail", ebsSource("fail-ebs")),
				pv("pv-other", CSISource("other.csi.test", "fail-2")),
				va("ok", driver, "pv-ok"),
				va("fail", driver, "pv-fail"),
				va("ebs-ok", ebs, "pv-ebs-ok"),
				va("ebs-fail", ebs, "pv-ebs-fail"),
				va("other", "other.csi.test", "pv-other"),
			}...)
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- NewAttacher(client, tc.opts).Run(ctx) }()

			Eventually(t, 10*time.Second, func() (bool, error) {
				for name, want := range tc.want {
					got, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						return false, err
					}
					if want == nil {
						continue
					}
					msg := ""
					if got.Status.AttachError != nil {
						msg = got.Status.AttachError.Message
					}
					if got.Status.Attached != want.Status.Attached || msg != want.Status.AttachError.Message ||
						!slices.Equal(got.Finalizers, want.Finalizers) {
						return false, nil
					}
					if want.Finalizers != nil && got.Annotations[NodeIDAnnotation] != "node-1" {
						return false, nil
					}
				}
				return true, nil
			}, "VolumeAttachments of handled drivers written")
			for name, want := range tc.want {
				if want != nil {
					continue
				}
				got, err := client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if got.Status.Attached || got.Status.AttachError != nil || len(got.Finalizers) != 0 {
					t.Errorf("VolumeAttachment %s of a driver not handled: status %+v, finalizers %v, want untouched", name, got.Status, got.Finalizers)
				}
			}

			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Run did not return 10s after its context was cancelled")
			}
		})
	}
}

// attached is the part of a VolumeAttachment TestAttacher compares.
func attached(ok bool, attachError string, finalizers []string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Finalizers: finalizers},
		Status:     storagev1.VolumeAttachmentStatus{Attached: ok, AttachError: &storagev1.VolumeError{Message: attachError}},
	}
}

func TestAttacherAttachDelay(t *testing.T) {
	const driver, delay = "csi.test", 300 * time.Millisecond
	pvName := "pv-1"
	client := fake.NewClientset(&storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-1"},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: driver, NodeName: "node-1",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName},
		},
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	asked := make(chan struct{}, 10)
	opts := AttacherOptions{Finalizer: true, AttachDelay: func() time.Duration {
		asked <- struct{}{}
		return delay
	}}
	started := time.Now()
	done := make(chan error, 1)
	go func() { done <- NewAttacher(client, opts).Run(ctx) }()
	var attachedAfter time.Duration
	Eventually(t, 10*time.Second, func() (bool, error) {
		got, err := client.StorageV1().VolumeAttachments().Get(ctx, "va-1", metav1.GetOptions{})
		if err != nil || !got.Status.Attached {
			return false, err
		}
		attachedAfter = time.Since(started)
		return true, nil
	}, "VolumeAttachment attached")
	if attachedAfter < delay {
		t.Errorf("attached %s after the attacher started, want at least the attach delay %s", attachedAfter, delay)
	}
	if len(asked) == 0 {
		t.Error("AttachDelay never asked")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
