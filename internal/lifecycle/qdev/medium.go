package qdev

import (
	"context"
	"fmt"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
)

// ChangeMedium puts the image of a CD-ROM's parts (qemuargs.Disk of the
// disk with its new file) into its running device: open the tray (forced:
// a guest that mounted the disc locks it), take the old medium out and
// delete its nodes, add the new nodes under the same names, insert, close.
// It starts from what QEMU has, so running it again after it was cut off
// at any point finishes the change.
func ChangeMedium(ctx context.Context, c *qmp.Conn, p qemuargs.DiskParts) error {
	if len(p.Devices) == 0 || len(p.Blockdevs) == 0 {
		return fmt.Errorf("no device to change the medium of")
	}
	dev := p.Devices[len(p.Devices)-1].ID // the scsi-cd, after its controller
	top := p.Blockdevs[len(p.Blockdevs)-1]
	file := p.Blockdevs[0].Filename
	blocks, err := c.QueryBlock(ctx)
	if err != nil {
		return fmt.Errorf("query-block: %w", err)
	}
	var cur *qmp.BlockInfo
	for i := range blocks {
		if blocks[i].QdevID == dev {
			cur = &blocks[i]
		}
	}
	if cur == nil {
		return fmt.Errorf("device %s is not in the VM", dev)
	}
	if in := cur.Inserted; in != nil && in.NodeName == top.NodeName && in.Image.Filename == file {
		return closeTray(ctx, c, dev, cur) // in already
	}
	if err := c.BlockdevOpenTray(ctx, dev, true); err != nil {
		return fmt.Errorf("blockdev-open-tray: %w", err)
	}
	if cur.Inserted != nil {
		if err := c.BlockdevRemoveMedium(ctx, dev); err != nil {
			return fmt.Errorf("blockdev-remove-medium: %w", err)
		}
	}
	pr, err := Query(ctx, c)
	if err != nil {
		return err
	}
	for i := len(p.Blockdevs) - 1; i >= 0; i-- {
		if pr.Nodes[p.Blockdevs[i].NodeName] {
			if err := c.BlockdevDel(ctx, p.Blockdevs[i].NodeName); err != nil {
				return fmt.Errorf("blockdev-del %s: %w", p.Blockdevs[i].NodeName, err)
			}
		}
	}
	for _, b := range p.Blockdevs {
		if err := c.BlockdevAdd(ctx, b); err != nil {
			return fmt.Errorf("blockdev-add %s: %w", b.NodeName, err)
		}
	}
	if err := c.BlockdevInsertMedium(ctx, dev, top.NodeName); err != nil {
		return fmt.Errorf("blockdev-insert-medium: %w", err)
	}
	if err := c.BlockdevCloseTray(ctx, dev); err != nil {
		return fmt.Errorf("blockdev-close-tray: %w", err)
	}
	return nil
}

func closeTray(ctx context.Context, c *qmp.Conn, dev string, cur *qmp.BlockInfo) error {
	if cur.TrayOpen != nil && *cur.TrayOpen {
		if err := c.BlockdevCloseTray(ctx, dev); err != nil {
			return fmt.Errorf("blockdev-close-tray: %w", err)
		}
	}
	return nil
}
