package supervisor

import (
	"context"
	"io"
	"log/slog"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/livemigrate"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Live migration lives in internal/ops/livemigrate (its protocol, relay and
// transports in internal/ops/migwire): the source, the destination and their
// recovery. Here are its Host (migrateHost, with the start pipeline for a
// destination: incomingStart) and the public API, one line each.

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
	return livemigrate.New(s.env.Ops(), migrateHost{s})
}

// migrateHost is the supervisor as live migration's Host.
type migrateHost struct{ s *Supervisor }

var _ livemigrate.Host = migrateHost{}

func (h migrateHost) State() vmstore.Store { return h.s.env.State() }
func (h migrateHost) Systemd(ctx context.Context) (*units.Manager, error) {
	return h.s.env.Systemd(ctx)
}
func (h migrateHost) Logger() *slog.Logger { return h.s.env.Opts().Logger }
func (h migrateHost) AfterStep(vm, step string) {
	if h.s.env.Opts().AfterStep != nil {
		h.s.env.Opts().AfterStep(vm, step)
	}
}
func (h migrateHost) View(name string) (*vmstore.View, error) { return h.s.env.View(name) }
func (h migrateHost) QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	return h.s.env.QMPSession(ctx, name)
}
func (h migrateHost) Guard(ctx context.Context, name string) func() {
	return h.s.env.Guard(ctx, name)
}
func (h migrateHost) CheckPaths(ctx context.Context, f *spec.File) error {
	return h.s.CheckPaths(ctx, f)
}
func (h migrateHost) LastWords(ctx context.Context, unit string) string {
	return h.s.env.LastWords(ctx, unit)
}
func (h migrateHost) ApplyRuntime(ctx context.Context, c *qmp.Conn, vm *spec.VM, qmpPath string) error {
	return livesettings.Runtime(ctx, c, vm, qmpPath)
}
func (h migrateHost) ConsoleConfig(name string) consolelog.Config { return h.s.env.ConsoleConfig(name) }
func (h migrateHost) AfterStop(ctx context.Context, name string) error {
	return h.s.env.AfterStop(ctx, name)
}
func (h migrateHost) Disable(ctx context.Context, name string) error { return h.s.Disable(ctx, name) }
func (h migrateHost) SyncBootUnit(ctx context.Context) error {
	return h.s.env.AutostartMarks().SyncBootUnit(ctx)
}
func (h migrateHost) RunStateAt(ctx context.Context, sock string) qmp.RunState {
	return h.s.env.RunStateAt(ctx, sock)
}
func (h migrateHost) RemoveUnit(ctx context.Context, sd *units.Manager, unit string) {
	h.s.env.RemoveUnit(ctx, sd, unit)
}
func (h migrateHost) EndMove(ctx context.Context, name string, moved bool) error {
	return startplan.EndMove(ctx, name, moved, h.s.env.HostConcerns()...)
}

func (h migrateHost) CPRTransfer(ctx context.Context) (bool, string) { return h.s.env.CPRTransfer(ctx) }

func (h migrateHost) Images() imagestore.Store { return h.s.env.Images().Store }

// StartIncoming is the start pipeline of a migration destination.
func (h migrateHost) StartIncoming(f *spec.File, local bool, a livemigrate.StartArgs) livemigrate.Start {
	return h.s.env.StartIncoming(f, local, machine.IncomingArgs(a))
}
