package sim

import (
	"context"

	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

// eventually polls cond until it holds or 10 s have passed.
func eventually(t *testing.T, ctx context.Context, what string, cond func() (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond()
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// startSim runs a Simulator against a fake clientset; the returned stop
// cancels it and fails the test unless Run returns nil promptly.
func startSim(t *testing.T, opts *Options, objs ...any) (*fake.Clientset, context.Context, func()) {
	t.Helper()
	client, ctx, _, stop := startSimulator(t, opts, objs...)
	return client, ctx, stop
}

// startSimulator is startSim, with the Simulator.
func startSimulator(t *testing.T, opts *Options, objs ...any) (*fake.Clientset, context.Context, *Simulator, func()) {
	t.Helper()
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *v1.Pod:
			_, err = client.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *v1.PersistentVolumeClaim:
			_, err = client.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *v1.PersistentVolume:
			_, err = client.CoreV1().PersistentVolumes().Create(ctx, o, metav1.CreateOptions{})
		case *v1.Node:
			_, err = client.CoreV1().Nodes().Create(ctx, o, metav1.CreateOptions{})
		case *storagev1.CSINode:
			_, err = client.StorageV1().CSINodes().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected object %T", obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	s, err := New(client, *opts)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	return client, ctx, s, func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	}
}

func inUseOf(ctx context.Context, client *fake.Clientset, node string) ([]v1.UniqueVolumeName, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return n.Status.VolumesInUse, nil
}

func setAttached(t *testing.T, ctx context.Context, client *fake.Clientset, node string, names ...string) {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.VolumesAttached = attached(names...)
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
