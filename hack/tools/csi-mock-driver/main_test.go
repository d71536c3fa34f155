package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
)

// syncBuffer lets the test read what run prints while run goes on.
type syncBuffer struct {
	ch chan string
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.ch <- string(p)
	return len(p), nil
}

// start runs the driver and returns a connected client, the printed volume
// lines and a stop function that fails the test unless run returns cleanly.
func start(t *testing.T, opts options) (*grpc.ClientConn, string, func()) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	dir, err := os.MkdirTemp("", "csi-mock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	opts.endpoint = "unix://" + sock
	if opts.stopTimeout == 0 {
		opts.stopTimeout = time.Second
	}

	out := &syncBuffer{ch: make(chan string, 100)}
	done := make(chan error, 1)
	go func() { done <- run(ctx, opts, out) }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("run returned before serving: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("socket %s did not appear", sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var printed bytes.Buffer
	for len(out.ch) > 0 {
		printed.WriteString(<-out.ch)
	}

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stop := func() {
		_ = conn.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("run did not return after cancel")
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("socket not removed: %v", err)
		}
	}
	return conn, printed.String(), stop
}

func publish(ctx context.Context, conn *grpc.ClientConn, handle, node string) error {
	_, err := csi.NewControllerClient(conn).ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: handle,
		NodeId:   node,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
	return err
}

func unpublish(ctx context.Context, conn *grpc.ClientConn, handle, node string) error {
	_, err := csi.NewControllerClient(conn).ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: handle, NodeId: node})
	return err
}

func TestStrictHandles(t *testing.T) {
	const driver = "mock.csi.example.com"
	conn, printed, stop := start(t, options{driverName: driver, attachRequired: true, volumes: "a, b", preprovision: 1})
	defer stop()
	ctx := context.Background()

	wantLines := []string{
		`volume handle="1" name="Mock Volume 1"`,
		`volume handle="4" name="a"`,
		`volume handle="5" name="b"`,
		`volume handle="6" name="mock-vol-1"`,
	}
	for _, l := range wantLines {
		if !strings.Contains(printed, l+"\n") {
			t.Errorf("output lacks %q; got:\n%s", l, printed)
		}
	}

	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != driver {
		t.Fatalf("GetPluginInfo = %v, %v; want name %s", info, err, driver)
	}
	if !hasPublishCap(t, ctx, conn) {
		t.Error("PUBLISH_UNPUBLISH_VOLUME not advertised with --attach-required")
	}

	for _, h := range []string{"1", "3", "4", "6"} {
		if err := publish(ctx, conn, h, driver); err != nil {
			t.Errorf("publish %s: %v", h, err)
		}
		if err := publish(ctx, conn, h, driver); err != nil {
			t.Errorf("publish %s again (idempotent): %v", h, err)
		}
		if err := unpublish(ctx, conn, h, driver); err != nil {
			t.Errorf("unpublish %s: %v", h, err)
		}
	}
	for _, tc := range []struct{ handle, node string }{
		{"7", driver},       // never created
		{"a", driver},       // a name is not a handle in strict mode
		{"vol-abc", driver}, // arbitrary
		{"4", "other-node"}, // the only node ID is the driver name
	} {
		if err := publish(ctx, conn, tc.handle, tc.node); status.Code(err) != codes.NotFound {
			t.Errorf("publish %s to %s: got %v, want NotFound", tc.handle, tc.node, err)
		}
	}
	if err := unpublish(ctx, conn, "vol-abc", driver); err != nil {
		t.Errorf("unpublish of an unknown handle must succeed: %v", err)
	}
}

func TestAnyHandle(t *testing.T) {
	const driver = "any.csi.example.com"
	conn, printed, stop := start(t, options{driverName: driver, attachRequired: true, anyHandle: true, volumes: "pre"})
	defer stop()
	ctx := context.Background()

	if !strings.Contains(printed, `volume handle="pre" name="pre"`) {
		t.Errorf("output lacks the pre-created handle; got:\n%s", printed)
	}
	for _, h := range []string{"pre", "vol-abc", "pvc-1234^x", "1"} {
		if err := publish(ctx, conn, h, driver); err != nil {
			t.Errorf("publish %s: %v", h, err)
		}
	}
	if err := publish(ctx, conn, "vol-abc", "other-node"); status.Code(err) != codes.NotFound {
		t.Errorf("publish to a foreign node: got %v, want NotFound", err)
	}
	resp, err := csi.NewControllerClient(conn).ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range resp.GetEntries() {
		listed[e.GetVolume().GetVolumeId()] = true
	}
	for _, h := range []string{"pre", "vol-abc", "pvc-1234^x", "1"} {
		if !listed[h] {
			t.Errorf("ListVolumes lacks handle %s: %v", h, listed)
		}
	}
	if err := unpublish(ctx, conn, "vol-abc", driver); err != nil {
		t.Errorf("unpublish: %v", err)
	}
}

func TestNoAttach(t *testing.T) {
	conn, _, stop := start(t, options{driverName: "noattach.csi.example.com"})
	defer stop()
	ctx := context.Background()
	if hasPublishCap(t, ctx, conn) {
		t.Error("PUBLISH_UNPUBLISH_VOLUME advertised without --attach-required")
	}
	if err := publish(ctx, conn, "1", "noattach.csi.example.com"); status.Code(err) != codes.Unimplemented {
		t.Errorf("publish: got %v, want Unimplemented", err)
	}
}

func hasPublishCap(t *testing.T, ctx context.Context, conn *grpc.ClientConn) bool {
	t.Helper()
	caps, err := csi.NewControllerClient(conn).ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatalf("ControllerGetCapabilities: %v", err)
	}
	for _, c := range caps.GetCapabilities() {
		if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME {
			return true
		}
	}
	return false
}

func TestSocketPath(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		wantErr  bool
	}{
		{in: "/tmp/x.sock", want: "/tmp/x.sock"},
		{in: "unix:///tmp/x.sock", want: "/tmp/x.sock"},
		{in: "unix://rel.sock", want: "rel.sock"},
		{in: "tcp://127.0.0.1:1", wantErr: true},
		{in: "unix://", wantErr: true},
	} {
		got, err := socketPath(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("socketPath(%q) = %q, %v; want %q, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}
