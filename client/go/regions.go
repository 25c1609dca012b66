package samplerd

import (
	"context"

	"samplerd.dev/client/go/samplerdv1"
)

// Region calls are served over the server's unix socket, and over TCP only when it runs with
// --allow_remote_regions (else PERMISSION_DENIED). Region names are 1 to 128 characters of
// [A-Za-z0-9._-].

// RegisterHostShm registers bytes [offset, offset+byteSize) of the POSIX shm object key
// (created by the caller; the key must start with the server's --shm_prefix) as region name.
// NewHostShmRegion does all of it for a buffer this client owns. Do not shrink the object while
// it is registered.
func (c *Client) RegisterHostShm(ctx context.Context, name, key string, offset, byteSize uint64) (*samplerdv1.RegionInfo, error) {
	if err := checkUTF8("host_shm.key", key, false); err != nil {
		return nil, err
	}
	return c.register(ctx, &samplerdv1.RegisterRegionRequest{
		Name: name,
		Kind: &samplerdv1.RegisterRegionRequest_HostShm{HostShm: &samplerdv1.HostShmRegion{
			Key: key, Offset: offset, ByteSize: byteSize,
		}},
	})
}

// RegisterGpuIpc registers GPU memory of another process as region name: handle is the
// allocation's IPC memory handle (64 bytes, or PyTorch's 66-byte shareable form), offset the
// region's start from the allocation's base, device the GPU's PCI bus id or UUID as ServerInfo
// lists it.
func (c *Client) RegisterGpuIpc(ctx context.Context, name string, handle []byte, offset, byteSize uint64, device string) (*samplerdv1.RegionInfo, error) {
	if err := checkUTF8("gpu_ipc.device", device, true); err != nil {
		return nil, err
	}
	return c.register(ctx, &samplerdv1.RegisterRegionRequest{
		Name: name,
		Kind: &samplerdv1.RegisterRegionRequest_GpuIpc{GpuIpc: &samplerdv1.GpuIpcRegion{
			MemoryHandle: handle, Offset: offset, ByteSize: byteSize, Device: device,
		}},
	})
}

// register sends a RegisterRegion call and returns the server's description of the region.
func (c *Client) register(ctx context.Context, req *samplerdv1.RegisterRegionRequest) (*samplerdv1.RegionInfo, error) {
	if err := checkUTF8("name", req.Name, true); err != nil {
		return nil, err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	resp, err := c.stub.RegisterRegion(ctx, req)
	if err != nil {
		return nil, fromRPC(err)
	}
	return resp.GetRegion(), nil
}

// Unregister forgets region name; requests still using it finish first. It does not touch the
// memory: use HostShmRegion.Close for regions made by NewHostShmRegion.
func (c *Client) Unregister(ctx context.Context, name string) error {
	if err := checkUTF8("name", name, true); err != nil {
		return err
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	_, err := c.stub.UnregisterRegion(ctx, &samplerdv1.UnregisterRegionRequest{Name: name})
	return fromRPC(err)
}

// ListRegions returns the registered regions, sorted by name.
func (c *Client) ListRegions(ctx context.Context) ([]*samplerdv1.RegionInfo, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	resp, err := c.stub.ListRegions(ctx, &samplerdv1.ListRegionsRequest{})
	if err != nil {
		return nil, fromRPC(err)
	}
	return resp.GetRegions(), nil
}
