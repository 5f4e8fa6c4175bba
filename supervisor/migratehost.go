package supervisor

import (
	"context"
	"io"

	"github.com/vmsup/vmsup/internal/ops/livemigrate"
	"github.com/vmsup/vmsup/internal/ops/migwire"
)

// Live migration lives in internal/ops/livemigrate (its protocol, relay and
// transports in internal/ops/migwire): the source, the destination and their
// recovery, over the lifecycle's Env. Here is its public API, one line each.

// MigrateOptions configure Migrate. Zero values have documented defaults.
type MigrateOptions = migwire.Options

// MigrationProgress is one progress report.
type MigrationProgress = migwire.Progress

// MigrateResult reports a completed migration.
type MigrateResult = migwire.Result

// Migration modes (MigrateResult.Mode): the guest's RAM copied, or taken
// over in place by a new QEMU on the same host.
const (
	MigrationModeNormal      = migwire.ModeNormal
	MigrationModeCPRTransfer = migwire.ModeCPRTransfer
)

// ErrMigrationCancelled is a migration cancelled by the user (Ctrl-C, or
// CancelMigration from another process).
var ErrMigrationCancelled = migwire.ErrCancelled

// RemoteError is a failure the destination reported.
type RemoteError = migwire.RemoteError

// MigrateError is a failed migration; the guest still runs where Running
// says.
type MigrateError = livemigrate.Error

// Migrate moves the running VM name to another host (o.To) or into a new
// QEMU on this host (o.Local).
func (s *Supervisor) Migrate(ctx context.Context, name string, o MigrateOptions) (MigrateResult, error) {
	return s.migrator().Migrate(ctx, name, o)
}

// Move moves the shut-off VM name to another host (o.To, with the
// migration's transport, address, bandwidth and keep-source-disks
// options; those about the guest's RAM are ignored): its local disks are
// copied as a storage migration copies them, then it is defined and shut
// off there, and gone from here. A running VM is refused (Migrate moves
// it).
func (s *Supervisor) Move(ctx context.Context, name string, o MigrateOptions) (MigrateResult, error) {
	return s.migrator().Move(ctx, name, o)
}

// CancelMigration cancels the VM's outgoing migration (QMP migrate_cancel);
// the vmsup migrating it then tears the destination down and the guest
// keeps running here.
func (s *Supervisor) CancelMigration(ctx context.Context, name string) error {
	return s.migrator().Cancel(ctx, name)
}

// Receive serves one incoming migration over r (the source's requests) and
// w (replies): it is "vmsup migrate-receive", run by the source through its
// transport. Everything it sets up is torn down again unless the source
// finalizes; the guest then runs here and the VM's state lives under this
// host's Root.
func (s *Supervisor) Receive(ctx context.Context, r io.Reader, w io.Writer) error {
	return s.migrator().Receive(ctx, r, w)
}

// HandOverSteps are the steps of a migration destination's hand-over (its
// QEMU runs the guest: its sockets take the VM's names, then the record is
// written), in order, as AfterStep sees them.
func HandOverSteps() []string { return livemigrate.HandOverSteps() }

func (s *Supervisor) migrator() *livemigrate.Migrator {
	return livemigrate.New(s.env.Ops(), s.env)
}
