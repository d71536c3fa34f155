package main

import (
	"context"
	"maps"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

func createReq(name string, req *csi.TopologyRequirement) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name: name,
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		CapacityRange:             &csi.CapacityRange{RequiredBytes: 1 << 30},
		AccessibilityRequirements: req,
	}
}

func zones(key string, zs ...string) []*csi.Topology {
	var out []*csi.Topology
	for _, z := range zs {
		out = append(out, &csi.Topology{Segments: map[string]string{key: z}})
	}
	return out
}

func pluginHasTopology(t *testing.T, ctx context.Context, conn *grpc.ClientConn) bool {
	t.Helper()
	caps, err := csi.NewIdentityClient(conn).GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatalf("GetPluginCapabilities: %v", err)
	}
	for _, c := range caps.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
			return true
		}
	}
	return false
}

// TestProvisioning: what the external-provisioner does with the controller
// endpoint of the stack (--any-handle --any-node-id): a created volume's
// handle is its name, it attaches by that handle, and deletes are
// idempotent.
func TestProvisioning(t *testing.T) {
	const driver = "mock.csi.example.com"
	conn, _, stop := start(t, options{driverName: driver, attachRequired: true, anyHandle: true, anyNodeID: true})
	defer stop()
	ctx := context.Background()
	ctrl := csi.NewControllerClient(conn)

	caps, err := ctrl.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var create bool
	for _, c := range caps.GetCapabilities() {
		create = create || c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME
	}
	if !create {
		t.Error("CREATE_DELETE_VOLUME not advertised")
	}
	if pluginHasTopology(t, ctx, conn) {
		t.Error("VOLUME_ACCESSIBILITY_CONSTRAINTS advertised without --topology")
	}

	const name = "pvc-0b5e7f3c-1111-4a2b-9c3d-123456789abc"
	resp, err := ctrl.CreateVolume(ctx, createReq(name, &csi.TopologyRequirement{Preferred: zones(defaultTopologyKey, "a")}))
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	if v := resp.GetVolume(); v.GetVolumeId() != name || v.GetCapacityBytes() != 1<<30 || len(v.GetAccessibleTopology()) != 0 {
		t.Errorf("CreateVolume = %v, want ID %s, 1 GiB, no topology (topology off)", v, name)
	}
	again, err := ctrl.CreateVolume(ctx, createReq(name, nil))
	if err != nil || again.GetVolume().GetVolumeId() != name {
		t.Errorf("CreateVolume again (idempotent) = %v, %v; want ID %s", again, err, name)
	}
	if err := publish(ctx, conn, name, "node-a-id"); err != nil {
		t.Errorf("publish the created volume by its handle: %v", err)
	}
	if err := unpublish(ctx, conn, name, "node-a-id"); err != nil {
		t.Errorf("unpublish: %v", err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: name}); err != nil {
		t.Errorf("DeleteVolume: %v", err)
	}
	list, err := ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.GetEntries() {
		if e.GetVolume().GetVolumeId() == name {
			t.Errorf("volume %s still listed after DeleteVolume", name)
		}
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: name}); err != nil {
		t.Errorf("DeleteVolume of a deleted volume must succeed: %v", err)
	}
}

// TestTopology: with --topology the plugin advertises accessibility
// constraints and places each volume in the zone asked for, as the
// external-provisioner asks (the selected node's zone preferred first).
func TestTopology(t *testing.T) {
	const driver = "mock.csi.example.com"
	conn, _, stop := start(t, options{driverName: driver, attachRequired: true, anyHandle: true, anyNodeID: true, topology: true, topologyKey: defaultTopologyKey})
	defer stop()
	ctx := context.Background()
	if !pluginHasTopology(t, ctx, conn) {
		t.Fatal("VOLUME_ACCESSIBILITY_CONSTRAINTS not advertised with --topology")
	}
	ctrl := csi.NewControllerClient(conn)
	for _, tc := range []struct {
		name string
		req  *csi.TopologyRequirement
		want []map[string]string
	}{
		{"preferred-first", &csi.TopologyRequirement{Requisite: zones(defaultTopologyKey, "a", "b"), Preferred: zones(defaultTopologyKey, "b", "a")},
			[]map[string]string{{defaultTopologyKey: "b"}}},
		{"requisite-only", &csi.TopologyRequirement{Requisite: zones(defaultTopologyKey, "c", "a")},
			[]map[string]string{{defaultTopologyKey: "c"}}},
		{"other-key-ignored", &csi.TopologyRequirement{Preferred: append(zones("example.com/rack", "r1"), zones(defaultTopologyKey, "a")...)},
			[]map[string]string{{defaultTopologyKey: "a"}}},
		{"no-requirements", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := ctrl.CreateVolume(ctx, createReq("pvc-"+tc.name, tc.req))
			if err != nil {
				t.Fatalf("CreateVolume: %v", err)
			}
			var got []map[string]string
			for _, top := range resp.GetVolume().GetAccessibleTopology() {
				got = append(got, top.GetSegments())
			}
			if len(got) != len(tc.want) || (len(got) == 1 && !maps.Equal(got[0], tc.want[0])) {
				t.Errorf("accessible topology %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPlaceIn(t *testing.T) {
	const key = defaultTopologyKey
	for _, tc := range []struct {
		name string
		req  *csi.TopologyRequirement
		want string
	}{
		{"nil", nil, ""},
		{"preferred", &csi.TopologyRequirement{Preferred: zones(key, "x", "y"), Requisite: zones(key, "y", "x")}, "x"},
		{"requisite", &csi.TopologyRequirement{Requisite: zones(key, "y")}, "y"},
		{"foreign key", &csi.TopologyRequirement{Preferred: zones("other", "x")}, ""},
	} {
		if got := placeIn(key, tc.req); got != tc.want {
			t.Errorf("%s: placeIn = %q, want %q", tc.name, got, tc.want)
		}
	}
}
