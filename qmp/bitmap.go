package qmp

import "context"

// Dirty bitmaps: which clusters of a node were written since the bitmap
// was made or cleared, the basis of incremental backup.

// BitmapAdd is block-dirty-bitmap-add's argument. A persistent bitmap is
// stored in the qcow2 image when QEMU closes it; Granularity 0 lets QEMU
// choose (the cluster size).
type BitmapAdd struct {
	Node        string `json:"node"`
	Name        string `json:"name"`
	Persistent  bool   `json:"persistent"`
	Disabled    bool   `json:"disabled"`
	Granularity int64  `json:"granularity,omitempty"`
}

// DirtyBitmap is one entry of a BlockNode's "dirty-bitmaps" (QEMU's
// BlockDirtyInfo). Count is in bytes, not clusters.
type DirtyBitmap struct {
	Name         string `json:"name"`
	Count        int64  `json:"count"`
	Granularity  int64  `json:"granularity"`
	Recording    bool   `json:"recording"`
	Busy         bool   `json:"busy"` // in use by a job or an export
	Persistent   bool   `json:"persistent"`
	Inconsistent bool   `json:"inconsistent,omitempty"` // QEMU died while it was in use: remove it
}

// BlockDirtyBitmapAdd adds a dirty bitmap to a node.
func (c *Conn) BlockDirtyBitmapAdd(ctx context.Context, b BitmapAdd) error {
	return c.Execute(ctx, "block-dirty-bitmap-add", b, nil)
}

// BlockDirtyBitmapRemove removes a bitmap (a persistent one from the image
// too).
func (c *Conn) BlockDirtyBitmapRemove(ctx context.Context, node, name string) error {
	return c.Execute(ctx, "block-dirty-bitmap-remove", bitmapRef{node, name}, nil)
}

// BlockDirtyBitmapClear marks every cluster clean.
func (c *Conn) BlockDirtyBitmapClear(ctx context.Context, node, name string) error {
	return c.Execute(ctx, "block-dirty-bitmap-clear", bitmapRef{node, name}, nil)
}

// BlockDirtyBitmapEnable makes a bitmap record writes.
func (c *Conn) BlockDirtyBitmapEnable(ctx context.Context, node, name string) error {
	return c.Execute(ctx, "block-dirty-bitmap-enable", bitmapRef{node, name}, nil)
}

// BlockDirtyBitmapDisable stops a bitmap recording writes.
func (c *Conn) BlockDirtyBitmapDisable(ctx context.Context, node, name string) error {
	return c.Execute(ctx, "block-dirty-bitmap-disable", bitmapRef{node, name}, nil)
}

// BlockDirtyBitmapMerge ORs bitmaps (of the same node) into target.
func (c *Conn) BlockDirtyBitmapMerge(ctx context.Context, node, target string, bitmaps []string) error {
	args := struct {
		Node    string   `json:"node"`
		Target  string   `json:"target"`
		Bitmaps []string `json:"bitmaps"`
	}{node, target, bitmaps}
	return c.Execute(ctx, "block-dirty-bitmap-merge", args, nil)
}
