package qmp

import "context"

// Block devices as a guest sees them: what query-block reports per device,
// and the settings that change while the guest runs (I/O limits, the
// medium of a CD-ROM).

// BlockInfo is one device of query-block.
type BlockInfo struct {
	Device    string         `json:"device"` // legacy drive name; "" for -blockdev devices
	QdevID    string         `json:"qdev"`   // the device's QOM path or id
	Removable bool           `json:"removable"`
	Locked    bool           `json:"locked"`
	TrayOpen  *bool          `json:"tray_open,omitempty"`
	Inserted  *BlockInserted `json:"inserted,omitempty"` // nil: no medium
	// IOStatus is set only for devices whose error policy can stop the
	// guest (werror/rerror "stop" or "enospc"): IOStatusOK, or the error
	// that stopped it.
	IOStatus IOStatus `json:"io-status,omitempty"`
}

// IOStatus is query-block's io-status of a device.
type IOStatus string

// The io-status values QEMU reports.
const (
	IOStatusOK      IOStatus = "ok"
	IOStatusFailed  IOStatus = "failed"
	IOStatusNoSpace IOStatus = "nospace"
)

// BlockInserted is the medium in a device, with its I/O limits.
type BlockInserted struct {
	File      string `json:"file"`
	NodeName  string `json:"node-name"`
	ReadOnly  bool   `json:"ro"`
	IOPS      int64  `json:"iops"`
	IOPSRead  int64  `json:"iops_rd"`
	IOPSWrite int64  `json:"iops_wr"`
	BPS       int64  `json:"bps"`
	BPSRead   int64  `json:"bps_rd"`
	BPSWrite  int64  `json:"bps_wr"`
	Image     struct {
		Filename string `json:"filename"`
	} `json:"image"`
}

// QueryBlock lists the VM's block devices.
func (c *Conn) QueryBlock(ctx context.Context) ([]BlockInfo, error) {
	var out []BlockInfo
	err := c.Execute(ctx, "query-block", nil, &out)
	return out, err
}

// IOThrottle is block_set_io_throttle's argument: the device by its qdev
// id, and every limit (zero is unlimited; all six are required by QEMU).
type IOThrottle struct {
	ID        string `json:"id"`
	IOPS      int64  `json:"iops"`
	IOPSRead  int64  `json:"iops_rd"`
	IOPSWrite int64  `json:"iops_wr"`
	BPS       int64  `json:"bps"`
	BPSRead   int64  `json:"bps_rd"`
	BPSWrite  int64  `json:"bps_wr"`
}

// BlockSetIOThrottle sets a device's I/O limits (all zero: none).
func (c *Conn) BlockSetIOThrottle(ctx context.Context, t IOThrottle) error {
	return c.Execute(ctx, "block_set_io_throttle", t, nil)
}

// MediumChange is blockdev-change-medium's argument: the device by its qdev
// id, the new image and its format, opened read-only.
type MediumChange struct {
	ID       string `json:"id"`
	Filename string `json:"filename"`
	Format   string `json:"format,omitempty"`
	ReadOnly string `json:"read-only-mode,omitempty"` // "retain", "read-only", "read-write"
}

// BlockdevChangeMedium swaps the medium of a removable device (a CD-ROM):
// QEMU opens the new image itself, ejects the old one and closes the tray.
func (c *Conn) BlockdevChangeMedium(ctx context.Context, m MediumChange) error {
	return c.Execute(ctx, "blockdev-change-medium", m, nil)
}

// SetLink sets a NIC's link state as the guest sees it; name is the
// device's (or netdev's) id.
func (c *Conn) SetLink(ctx context.Context, name string, up bool) error {
	args := struct {
		Name string `json:"name"`
		Up   bool   `json:"up"`
	}{name, up}
	return c.Execute(ctx, "set_link", args, nil)
}

// The removable-medium commands, by the device's qdev id: a CD-ROM's medium
// is swapped as open tray, remove, insert a block node, close tray.

// BlockdevOpenTray opens the tray; force opens it even when the guest
// locked it.
func (c *Conn) BlockdevOpenTray(ctx context.Context, id string, force bool) error {
	args := struct {
		ID    string `json:"id"`
		Force bool   `json:"force"`
	}{id, force}
	return c.Execute(ctx, "blockdev-open-tray", args, nil)
}

// BlockdevRemoveMedium takes the medium out of an open tray.
func (c *Conn) BlockdevRemoveMedium(ctx context.Context, id string) error {
	args := struct {
		ID string `json:"id"`
	}{id}
	return c.Execute(ctx, "blockdev-remove-medium", args, nil)
}

// BlockdevInsertMedium puts a block node into an open, empty tray.
func (c *Conn) BlockdevInsertMedium(ctx context.Context, id, node string) error {
	args := struct {
		ID       string `json:"id"`
		NodeName string `json:"node-name"`
	}{id, node}
	return c.Execute(ctx, "blockdev-insert-medium", args, nil)
}

// BlockdevCloseTray closes the tray.
func (c *Conn) BlockdevCloseTray(ctx context.Context, id string) error {
	args := struct {
		ID string `json:"id"`
	}{id}
	return c.Execute(ctx, "blockdev-close-tray", args, nil)
}

// BlockResize grows (or shrinks) a block node's image to size bytes.
func (c *Conn) BlockResize(ctx context.Context, node string, size int64) error {
	args := struct {
		NodeName string `json:"node-name"`
		Size     int64  `json:"size"`
	}{node, size}
	return c.Execute(ctx, "block_resize", args, nil)
}

// Balloon asks the guest's balloon driver to leave it bytes of memory.
func (c *Conn) Balloon(ctx context.Context, bytes int64) error {
	args := struct {
		Value int64 `json:"value"`
	}{bytes}
	return c.Execute(ctx, "balloon", args, nil)
}
