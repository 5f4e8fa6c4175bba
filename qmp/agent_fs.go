package qmp

import "context"

// Guest filesystem freeze for consistent snapshots: freeze, snapshot or
// start the backup, thaw at once. While frozen, guest writes block and
// qemu-ga accepts only a few commands (guest-ping, guest-fsfreeze-status,
// guest-fsfreeze-thaw, guest-sync-delimited, ...).
//
// Timeouts: guest-fsfreeze-freeze flushes every filesystem, which can take
// long on a busy guest, so its built-in timeout is long (DefaultTimeout:
// 5 min) and callers bound it with ctx; guest-fsfreeze-thaw gets 1 min.
// A freeze that timed out on our side may still complete in the guest:
// always call FSThaw after a failed FSFreeze.

// FSFreeze freezes the guest's filesystems and returns how many it froze.
func (a *Agent) FSFreeze(ctx context.Context) (int, error) {
	var n int
	err := a.Execute(ctx, "guest-fsfreeze-freeze", nil, &n)
	return n, err
}

// FSThaw thaws the guest's filesystems and returns how many it thawed (0
// if none were frozen).
func (a *Agent) FSThaw(ctx context.Context) (int, error) {
	var n int
	err := a.Execute(ctx, "guest-fsfreeze-thaw", nil, &n)
	return n, err
}

// FSFreezeStatus returns "thawed" or "frozen".
func (a *Agent) FSFreezeStatus(ctx context.Context) (string, error) {
	var s string
	err := a.Execute(ctx, "guest-fsfreeze-status", nil, &s)
	return s, err
}
