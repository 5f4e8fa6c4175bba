package qmp

import "context"

// The virtio introspection commands of QEMU 7.2 (experimental, x- prefix):
// what a virtio device's queues hold, which is the only place QMP shows the
// requests a device has taken from the guest and not yet answered.

// VirtioStatus is part of x-query-virtio-status for one device.
type VirtioStatus struct {
	Name   string `json:"name"` // "virtio-blk", ...
	NumVQs int    `json:"num-vqs"`
}

// QueryVirtioStatus describes the virtio device at path (its QOM path,
// e.g. /machine/peripheral/disk-root/virtio-backend).
func (c *Conn) QueryVirtioStatus(ctx context.Context, path string) (VirtioStatus, error) {
	var out VirtioStatus
	err := c.Execute(ctx, "x-query-virtio-status", struct {
		Path string `json:"path"`
	}{path}, &out)
	return out, err
}

// VirtQueueStatus is part of x-query-virtio-queue-status for one queue.
type VirtQueueStatus struct {
	Index int `json:"queue-index"`
	// InUse counts the requests the device popped from the queue and has
	// not pushed back: in flight in QEMU.
	InUse int `json:"inuse"`
}

// QueryVirtQueueStatus describes queue number queue of the virtio device
// at path.
func (c *Conn) QueryVirtQueueStatus(ctx context.Context, path string, queue int) (VirtQueueStatus, error) {
	var out VirtQueueStatus
	err := c.Execute(ctx, "x-query-virtio-queue-status", struct {
		Path  string `json:"path"`
		Queue int    `json:"queue"`
	}{path, queue}, &out)
	return out, err
}
