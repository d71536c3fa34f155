package main

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
)

// The node service, as a real kubelet calls it: NodeGetInfo gives the node
// ID kubelet writes to its CSINode and, with a zone, the node's topology
// (kubelet labels the node with it and lists its key in the CSINode); with
// anyHandle the stage and publish calls accept any handle, as
// ControllerPublish does. Calls are serialized with the controller's for the
// reason given on driver.

// withVolumeID answers req as the mock answers a copy of it that names
// the volume by the ID the mock holds for req's (volumeID), under the lock.
func withVolumeID[R interface {
	proto.Message
	GetVolumeId() string
}, T any](c *driver, ctx context.Context, req R, setID func(R, string), call func(context.Context, R) (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		var zero T
		return zero, err
	}
	req = proto.CloneOf(req)
	setID(req, id)
	return call(ctx, req)
}

func (c *driver) nodeIDOrName() string {
	if c.nodeID != "" {
		return c.nodeID
	}
	return c.name
}

func (c *driver) NodeGetInfo(ctx context.Context, req *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp, err := c.Service.NodeGetInfo(ctx, req)
	if err != nil {
		return nil, err
	}
	resp = proto.CloneOf(resp)
	resp.NodeId = c.nodeIDOrName()
	if c.topologyKey != "" && c.zone != "" {
		resp.AccessibleTopology = &csi.Topology{Segments: map[string]string{c.topologyKey: c.zone}}
	}
	return resp, nil
}

func (c *driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	return withVolumeID(c, ctx, req, func(r *csi.NodeStageVolumeRequest, id string) { r.VolumeId = id }, c.Service.NodeStageVolume)
}

func (c *driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	return withVolumeID(c, ctx, req, func(r *csi.NodeUnstageVolumeRequest, id string) { r.VolumeId = id }, c.Service.NodeUnstageVolume)
}

func (c *driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	return withVolumeID(c, ctx, req, func(r *csi.NodePublishVolumeRequest, id string) { r.VolumeId = id }, c.Service.NodePublishVolume)
}

func (c *driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	return withVolumeID(c, ctx, req, func(r *csi.NodeUnpublishVolumeRequest, id string) { r.VolumeId = id }, c.Service.NodeUnpublishVolume)
}

func (c *driver) NodeGetCapabilities(ctx context.Context, req *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	resp, err := c.Service.NodeGetCapabilities(ctx, req)
	if err != nil {
		return nil, err
	}
	return proto.CloneOf(resp), nil
}
