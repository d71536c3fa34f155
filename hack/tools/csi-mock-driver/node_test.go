package main

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// TestNodeMode: what a kubelet sees of a node-mode driver: the registration
// socket in its plugins_registry names the driver and its CSI socket, and
// the node service reports --node-id and stages and publishes any handle.
func TestNodeMode(t *testing.T) {
	const driver = "mock.csi.example.com"
	registry, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(registry) })
	conn, _, stop := start(t, options{driverName: driver, attachRequired: true, anyHandle: true, nodeID: "node-1-id", registrationDir: registry})
	defer stop()
	ctx := context.Background()

	regConn, err := grpc.NewClient("unix://"+filepath.Join(registry, driver+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = regConn.Close() }()
	reg := registerapi.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != driver || !slices.Contains(info.GetSupportedVersions(), "1.0.0") || !filepath.IsAbs(info.GetEndpoint()) {
		t.Errorf("GetInfo = %v, want a CSIPlugin named %s at an absolute socket path, version 1.0.0", info, driver)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Errorf("NotifyRegistrationStatus: %v", err)
	}

	node := csi.NewNodeClient(conn)
	ni, err := node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || ni.GetNodeId() != "node-1-id" {
		t.Errorf("NodeGetInfo = %v, %v; want node ID node-1-id", ni, err)
	}
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol-abc", StagingTargetPath: staging, VolumeCapability: capability, PublishContext: map[string]string{"device": "/dev/mock"}}); err != nil {
		t.Errorf("NodeStageVolume: %v", err)
	}
	if _, err := node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol-abc", StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, PublishContext: map[string]string{"device": "/dev/mock"}}); err != nil {
		t.Errorf("NodePublishVolume: %v", err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-abc", TargetPath: target}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-abc", StagingTargetPath: staging}); err != nil {
		t.Errorf("NodeUnstageVolume: %v", err)
	}
}

// TestAnyNodeID: one controller endpoint publishes to every node's ID and
// ListVolumes reports each volume on the nodes it is published to.
func TestAnyNodeID(t *testing.T) {
	const driver = "mock.csi.example.com"
	conn, _, stop := start(t, options{driverName: driver, attachRequired: true, anyHandle: true, anyNodeID: true})
	defer stop()
	ctx := context.Background()
	for _, n := range []string{"a-id", "b-id"} {
		if err := publish(ctx, conn, "shared", n); err != nil {
			t.Fatalf("publish to %s: %v", n, err)
		}
	}
	published := func() []string {
		resp, err := csi.NewControllerClient(conn).ListVolumes(ctx, &csi.ListVolumesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.GetEntries() {
			if e.GetVolume().GetVolumeId() == "shared" {
				return e.GetStatus().GetPublishedNodeIds()
			}
		}
		t.Fatal("ListVolumes lacks shared")
		return nil
	}
	if got := published(); !slices.Equal(got, []string{"a-id", "b-id"}) {
		t.Errorf("published on %v, want [a-id b-id]", got)
	}
	if err := unpublish(ctx, conn, "shared", "a-id"); err != nil {
		t.Fatal(err)
	}
	if got := published(); !slices.Equal(got, []string{"b-id"}) {
		t.Errorf("after unpublish from a-id: published on %v, want [b-id]", got)
	}
}

// TestNodeZone: a node-mode driver with --zone reports the node's zone, the
// segment kubelet writes to the node's labels and the key to its CSINode;
// without --zone it reports none.
func TestNodeZone(t *testing.T) {
	const driver = "mock.csi.example.com"
	for _, tc := range []struct {
		zone string
		want map[string]string
	}{
		{"zone-b", map[string]string{defaultTopologyKey: "zone-b"}},
		{"", nil},
	} {
		t.Run("zone="+tc.zone, func(t *testing.T) {
			conn, _, stop := start(t, options{driverName: driver, attachRequired: true, anyHandle: true, nodeID: "n-id", zone: tc.zone, topologyKey: defaultTopologyKey})
			defer stop()
			ctx := context.Background()
			ni, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if got := ni.GetAccessibleTopology().GetSegments(); !maps.Equal(got, tc.want) || ni.GetNodeId() != "n-id" {
				t.Errorf("NodeGetInfo = %v, want node ID n-id, topology %v", ni, tc.want)
			}
			if got := pluginHasTopology(t, ctx, conn); got != (tc.zone != "") {
				t.Errorf("VOLUME_ACCESSIBILITY_CONSTRAINTS advertised: %t, want %t", got, tc.zone != "")
			}
		})
	}
}
