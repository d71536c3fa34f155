package main

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
)

// defaultTopologyKey is the well-known zone label: kubelet copies the
// segment NodeGetInfo reports into a node label of the same key, so a
// driver that reports it agrees with the nodes' zone labels.
const defaultTopologyKey = "topology.kubernetes.io/zone"

// GetPluginCapabilities is the mock's, plus VOLUME_ACCESSIBILITY_CONSTRAINTS
// when topology is on: the external-provisioner passes topology
// requirements only to a plugin that advertises it.
func (c *driver) GetPluginCapabilities(ctx context.Context, req *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	resp, err := c.Service.GetPluginCapabilities(ctx, req)
	if err != nil || c.topologyKey == "" {
		return resp, err
	}
	resp = proto.CloneOf(resp)
	resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS,
		}},
	})
	return resp, nil
}

// CreateVolume creates the volume in the mock (idempotent by name). With
// anyHandle the name is the volume's handle; with topology the volume lives
// in the zone placeIn picks.
func (c *driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp, err := c.Service.CreateVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	resp = proto.CloneOf(resp)
	if c.anyHandle {
		resp.Volume.VolumeId = req.GetName()
	}
	if c.topologyKey != "" {
		resp.Volume.AccessibleTopology = nil
		if zone := placeIn(c.topologyKey, req.GetAccessibilityRequirements()); zone != "" {
			resp.Volume.AccessibleTopology = []*csi.Topology{{Segments: map[string]string{c.topologyKey: zone}}}
		}
	}
	return resp, nil
}

// placeIn picks the zone of a new volume: the first preferred segment's,
// else the first requisite one's, as a driver with zonal disks does. ""
// when the request says nothing about key: reachable from everywhere.
func placeIn(key string, req *csi.TopologyRequirement) string {
	for _, list := range [][]*csi.Topology{req.GetPreferred(), req.GetRequisite()} {
		for _, t := range list {
			if zone := t.GetSegments()[key]; zone != "" {
				return zone
			}
		}
	}
	return ""
}

// DeleteVolume deletes the volume the handle names; an unknown handle is
// already deleted.
func (c *driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := req.GetVolumeId()
	if c.anyHandle && id != "" {
		var err error
		if id, err = c.idOfName(ctx, id); err != nil {
			return nil, err
		}
		if id == "" {
			return &csi.DeleteVolumeResponse{}, nil
		}
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.DeleteVolume(ctx, req)
}

// idOfName is the mock's ID of the volume called name, "" if there is
// none; it creates nothing. Called with mu held.
func (c *driver) idOfName(ctx context.Context, name string) (string, error) {
	resp, err := c.Service.ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		return "", err
	}
	for _, e := range resp.GetEntries() {
		if v := e.GetVolume(); v.GetVolumeContext()["name"] == name {
			return v.GetVolumeId(), nil
		}
	}
	return "", nil
}
