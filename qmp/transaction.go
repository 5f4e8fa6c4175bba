package qmp

import "context"

// Transactions: several block actions applied atomically, so that e.g. a
// snapshot and a fresh dirty bitmap describe the same instant
// (`man 7 qemu-qmp-ref`, "transaction").

// TransactionAction is one action of a transaction. Data is the action's
// arguments, the same as those of the command named Type.
type TransactionAction struct {
	Type string `json:"type"`
	Data any    `json:"data"`
}

// blockdevSnapshot is blockdev-snapshot's argument.
type blockdevSnapshot struct {
	Node    string `json:"node"`
	Overlay string `json:"overlay"`
}

// bitmapRef names a dirty bitmap on a node (QEMU's BlockDirtyBitmap).
type bitmapRef struct {
	Node string `json:"node"`
	Name string `json:"name"`
}

// SnapshotAction makes overlay, a node added with blockdev-add without a
// backing node, the new active layer on top of node (blockdev-snapshot).
func SnapshotAction(node, overlay string) TransactionAction {
	return TransactionAction{"blockdev-snapshot", blockdevSnapshot{node, overlay}}
}

// BitmapAddAction adds a dirty bitmap (block-dirty-bitmap-add).
func BitmapAddAction(b BitmapAdd) TransactionAction {
	return TransactionAction{"block-dirty-bitmap-add", b}
}

// BitmapClearAction clears a dirty bitmap (block-dirty-bitmap-clear).
func BitmapClearAction(node, name string) TransactionAction {
	return TransactionAction{"block-dirty-bitmap-clear", bitmapRef{node, name}}
}

// BitmapRemoveAction removes a dirty bitmap (block-dirty-bitmap-remove).
func BitmapRemoveAction(node, name string) TransactionAction {
	return TransactionAction{"block-dirty-bitmap-remove", bitmapRef{node, name}}
}

// BitmapDisableAction stops a bitmap recording writes, freezing what it
// holds (a read-only NBD export refuses an enabled bitmap).
func BitmapDisableAction(node, name string) TransactionAction {
	return TransactionAction{"block-dirty-bitmap-disable", bitmapRef{node, name}}
}

// BackupAction starts a blockdev-backup job.
func BackupAction(b Backup) TransactionAction {
	return TransactionAction{"blockdev-backup", b}
}

// Transaction applies actions atomically: if one fails, none takes effect.
// With grouped, the jobs the actions start also succeed or fail together
// (completion-mode "grouped": one job failing cancels the others); QEMU
// 7.2 then refuses any action that is not a job ("Action
// 'block-dirty-bitmap-add' does not support Transaction property
// completion-mode = grouped").
func (c *Conn) Transaction(ctx context.Context, actions []TransactionAction, grouped bool) error {
	type properties struct {
		CompletionMode string `json:"completion-mode,omitempty"`
	}
	args := struct {
		Actions    []TransactionAction `json:"actions"`
		Properties *properties         `json:"properties,omitempty"`
	}{Actions: actions}
	if args.Actions == nil {
		args.Actions = []TransactionAction{} // QEMU requires the key
	}
	if grouped {
		args.Properties = &properties{"grouped"}
	}
	return c.Execute(ctx, "transaction", args, nil)
}

// BlockdevSnapshot makes overlay the new active layer on top of node (see
// SnapshotAction).
func (c *Conn) BlockdevSnapshot(ctx context.Context, node, overlay string) error {
	return c.Execute(ctx, "blockdev-snapshot", blockdevSnapshot{node, overlay}, nil)
}
