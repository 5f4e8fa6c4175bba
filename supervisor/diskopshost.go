package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/ops/diskops"
)

// The disk operations (snapshots, backups, disk moves, the NBD export,
// clones) live in internal/ops/diskops, over the environment; the
// supervisor keeps its public methods and types.

// SnapshotOptions say what a snapshot keeps.
type SnapshotOptions = diskops.SnapshotOptions

// SnapshotResult reports a snapshot taken.
type SnapshotResult = diskops.SnapshotResult

// RevertResult reports a revert.
type RevertResult = diskops.RevertResult

// BackupOptions say where a backup goes and what kind it is.
type BackupOptions = diskops.BackupOptions

// BackupProgress is the copy's progress, summed over the disks.
type BackupProgress = diskops.BackupProgress

// BackupResult reports a backup point taken.
type BackupResult = diskops.BackupResult

// RestoreOptions say which backup point becomes which new image.
type RestoreOptions = diskops.RestoreOptions

// RestoreResult reports a restore.
type RestoreResult = diskops.RestoreResult

// MoveOptions say where MoveDisk puts a disk.
type MoveOptions = diskops.MoveOptions

// MoveProgress is one report of a move.
type MoveProgress = diskops.MoveProgress

// MoveResult reports a move done.
type MoveResult = diskops.MoveResult

// ExportOptions say where an NBD export serves and whom to tell.
type ExportOptions = diskops.ExportOptions

// ExportInfo is what an NBD export's client needs.
type ExportInfo = diskops.ExportInfo

// ExportDisk is one disk's NBD export.
type ExportDisk = diskops.ExportDisk

// CloneResult reports a clone: its start's result, and what the clone is
// (From, Disks, File, Dropped: diskops.Clone).
type CloneResult struct {
	UpResult
	diskops.Clone
}

// Snapshot takes snapshot tag of VM name, running or shut off.
func (s *Supervisor) Snapshot(ctx context.Context, name, tag string, o SnapshotOptions) (SnapshotResult, error) {
	return s.diskops().Snapshot(ctx, name, tag, o)
}

// SnapshotTree is VM name's snapshot tree (empty when it has none).
func (s *Supervisor) SnapshotTree(name string) (*SnapshotTree, error) {
	return s.diskops().SnapshotTree(name)
}

// RemoveSnapshot removes snapshot tag of VM name, running or off.
// progress, when set, sees each live merge go.
func (s *Supervisor) RemoveSnapshot(ctx context.Context, name, tag string, progress func(disk string, done, total int64)) error {
	return s.diskops().RemoveSnapshot(ctx, name, tag, progress)
}

// RevertSnapshot reverts VM name to snapshot tag. A running VM is stopped
// first (it loses its state since), only with force.
func (s *Supervisor) RevertSnapshot(ctx context.Context, name, tag string, force bool) (RevertResult, error) {
	return s.diskops().RevertSnapshot(ctx, name, tag, force)
}

// Backup takes the next backup point of VM name into o.Dir.
func (s *Supervisor) Backup(ctx context.Context, name string, o BackupOptions) (BackupResult, error) {
	return s.diskops().Backup(ctx, name, o)
}

// Restore verifies the checksums of the chain up to a point and writes
// the disk as it was then into a new image (qemu-img convert). It needs
// no VM: the result is an image file to attach or boot from.
func (s *Supervisor) Restore(ctx context.Context, o RestoreOptions) (RestoreResult, error) {
	return s.diskops().Restore(ctx, o)
}

// MoveDisk moves disk of the running VM name (see MoveOptions).
func (s *Supervisor) MoveDisk(ctx context.Context, name, disk string, o MoveOptions) (MoveResult, error) {
	return s.diskops().MoveDisk(ctx, name, disk, o)
}

// CancelDiskMove asks the move of disk in progress on VM name to cancel.
// The move's command holds the VM's lock and its monitor, so the request
// is a file it looks for at each progress poll; it then cancels its job
// (the device stays on the source) and takes the target out again.
func (s *Supervisor) CancelDiskMove(ctx context.Context, name, disk string) error {
	return s.diskops().CancelDiskMove(ctx, name, disk)
}

// ExportNBD exports VM name's writable image disks over NBD at one moment
// and serves until ctx ends, then takes it all down; the bitmap of the
// next export starts at this export's moment. The VM's lock is held while
// it serves (other commands on the VM wait or say it is busy); status
// still answers.
func (s *Supervisor) ExportNBD(ctx context.Context, name string, o ExportOptions) error {
	return s.diskops().ExportNBD(ctx, name, o)
}

// UpFromSnapshot starts VM newName from memory snapshot tag of VM src.
func (s *Supervisor) UpFromSnapshot(ctx context.Context, src, tag, newName string) (CloneResult, error) {
	c, st, err := s.diskops().UpFromSnapshot(ctx, src, tag, newName)
	res := CloneResult{UpResult: UpResult{VM: newName}, Clone: c}
	if err == nil {
		res.UpResult = UpResult{VM: newName, Action: Started, Accel: st.Accel, AccelReason: st.AccelReason, Note: st.Note,
			State: StateRunning}
	}
	return res, err
}

// diskops is the disk operations on this supervisor's VMs.
func (s *Supervisor) diskops() *diskops.Service { return diskops.New(s.env) }
