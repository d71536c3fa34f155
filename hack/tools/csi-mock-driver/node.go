package main

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
)

// The node service, as a real kubelet calls it: NodeGetInfo gives the node
// ID kubelet writes to its CSINode, and with anyHandle the stage and publish
// calls accept any handle, as ControllerPublish does. Calls are serialized
// with the controller's for the reason given on driver.

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
	return resp, nil
}

func (c *driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.NodeStageVolume(ctx, req)
}

func (c *driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.NodeUnstageVolume(ctx, req)
}

func (c *driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.NodePublishVolume(ctx, req)
}

func (c *driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := c.volumeID(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	req = proto.CloneOf(req)
	req.VolumeId = id
	return c.Service.NodeUnpublishVolume(ctx, req)
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
