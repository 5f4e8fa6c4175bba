package qmp

import "context"

// BlockStats is one device's entry of query-blockstats: the I/O its guest
// did since QEMU started.
type BlockStats struct {
	Device string `json:"device"` // the legacy drive name ("" for -blockdev disks)
	QdevID string `json:"qdev"`   // the device's QOM path, e.g. /machine/peripheral/disk-root/virtio-backend
	Stats  struct {
		ReadBytes      uint64 `json:"rd_bytes"`
		WriteBytes     uint64 `json:"wr_bytes"`
		ReadOps        uint64 `json:"rd_operations"`
		WriteOps       uint64 `json:"wr_operations"`
		FlushOps       uint64 `json:"flush_operations"`
		ReadTimeNanos  uint64 `json:"rd_total_time_ns"`
		WriteTimeNanos uint64 `json:"wr_total_time_ns"`
		FlushTimeNanos uint64 `json:"flush_total_time_ns"`
		UnmapOps       uint64 `json:"unmap_operations"`
		FailedReadOps  uint64 `json:"failed_rd_operations"`
		FailedWriteOps uint64 `json:"failed_wr_operations"`
		FailedFlushOps uint64 `json:"failed_flush_operations"`
		FailedUnmapOps uint64 `json:"failed_unmap_operations"`
		// IdleTimeNanos is the time since the device's last request
		// ended (done or failed); nil before its first.
		IdleTimeNanos *int64 `json:"idle_time_ns,omitempty"`
	} `json:"stats"`
}

// QueryBlockstats returns the I/O counters of every block device.
func (c *Conn) QueryBlockstats(ctx context.Context) ([]BlockStats, error) {
	var out []BlockStats
	err := c.Execute(ctx, "query-blockstats", nil, &out)
	return out, err
}

// QueryBalloon returns the memory the guest has now (after the balloon's
// inflation), in bytes; an error when the VM has no balloon.
func (c *Conn) QueryBalloon(ctx context.Context) (uint64, error) {
	var out struct {
		Actual uint64 `json:"actual"`
	}
	err := c.Execute(ctx, "query-balloon", nil, &out)
	return out.Actual, err
}

// BalloonGuestStats are the memory figures the guest's balloon driver
// reports (virtio-balloon's guest-stats property); -1 where the guest gave
// none.
type BalloonGuestStats struct {
	Stats struct {
		Total     int64 `json:"stat-total-memory"`
		Free      int64 `json:"stat-free-memory"`
		Available int64 `json:"stat-available-memory"`
	} `json:"stats"`
	LastUpdate int64 `json:"last-update"` // unix seconds; 0: never
}

// QOMGet reads the property of the QOM object at path into result.
func (c *Conn) QOMGet(ctx context.Context, path, property string, result any) error {
	args := struct {
		Path     string `json:"path"`
		Property string `json:"property"`
	}{path, property}
	return c.Execute(ctx, "qom-get", args, result)
}

// QOMSet sets the property of the QOM object at path.
func (c *Conn) QOMSet(ctx context.Context, path, property string, value any) error {
	args := struct {
		Path     string `json:"path"`
		Property string `json:"property"`
		Value    any    `json:"value"`
	}{path, property, value}
	return c.Execute(ctx, "qom-set", args, nil)
}
