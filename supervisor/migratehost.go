package supervisor

import (
	"context"
	"io"
	"log/slog"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/ops/apply"
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

func (s *Supervisor) migrator() *livemigrate.Migrator { return livemigrate.New(s.ops, migrateHost{s}) }

// migrateHost is the supervisor as live migration's Host.
type migrateHost struct{ s *Supervisor }

var _ livemigrate.Host = migrateHost{}

func (h migrateHost) State() vmstore.Store { return h.s.state }
func (h migrateHost) Systemd(ctx context.Context) (*units.Manager, error) {
	return h.s.systemd(ctx)
}
func (h migrateHost) Logger() *slog.Logger { return h.s.opts.Logger }
func (h migrateHost) AfterStep(vm, step string) {
	if h.s.opts.AfterStep != nil {
		h.s.opts.AfterStep(vm, step)
	}
}
func (h migrateHost) View(name string) (*vmstore.View, error) { return h.s.view(name) }
func (h migrateHost) QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	return h.s.qmpSession(ctx, name)
}
func (h migrateHost) Guard(ctx context.Context, name string) func() {
	return h.s.guard(ctx, name)
}
func (h migrateHost) CheckPaths(ctx context.Context, f *spec.File) error {
	return h.s.CheckPaths(ctx, f)
}
func (h migrateHost) LastWords(ctx context.Context, unit string) string {
	return h.s.lastWords(ctx, unit)
}
func (h migrateHost) ApplyRuntime(ctx context.Context, c *qmp.Conn, vm *spec.VM, qmpPath string) error {
	return apply.Runtime(ctx, c, vm, qmpPath)
}
func (h migrateHost) ConsoleConfig(name string) consolelog.Config { return h.s.consoleConfig(name) }
func (h migrateHost) AfterStop(ctx context.Context, name string) error {
	return h.s.afterStop(ctx, name)
}
func (h migrateHost) Disable(ctx context.Context, name string) error { return h.s.Disable(ctx, name) }
func (h migrateHost) SyncBootUnit(ctx context.Context) error {
	return h.s.autostart().SyncBootUnit(ctx)
}
func (h migrateHost) RunStateAt(ctx context.Context, sock string) qmp.RunState {
	return h.s.runStateAt(ctx, sock)
}
func (h migrateHost) RemoveUnit(ctx context.Context, sd *units.Manager, unit string) {
	h.s.removeUnit(ctx, sd, unit)
}
func (h migrateHost) EndMove(ctx context.Context, name string, moved bool) error {
	return startplan.EndMove(ctx, name, moved, h.s.hostConcerns()...)
}

func (h migrateHost) CPRTransfer(ctx context.Context) (bool, string) { return h.s.cprTransfer(ctx) }

func (h migrateHost) Images() imagestore.Store { return h.s.images().Store }

// cprTransfer says whether this host's QEMU can take a running guest's RAM
// over in place (cpr-transfer, from the host probe), or why not.
func (s *Supervisor) cprTransfer(ctx context.Context) (bool, string) {
	if s.opts.Host != nil && s.opts.HostCaps == nil {
		return false, "this vmsup was given host facts without a QEMU probe"
	}
	c, err := s.HostCaps(ctx, false)
	if err != nil {
		return false, err.Error()
	}
	return c.CPRTransfer()
}

// StartIncoming is the start pipeline of a migration destination.
func (h migrateHost) StartIncoming(f *spec.File, local bool, a livemigrate.StartArgs) livemigrate.Start {
	mode := StartIncoming
	if local {
		mode = StartIncomingLocal
	}
	return incomingStart{h.s.newStart(f, mode, incomingArgs{
		accel: a.Accel, cpu: cpuChoice{a.CPUModel, a.CPUMasks}, machine: a.Machine, ids: a.IDs, sourceFile: a.SourceFile, from: a.From,
		ramID: a.RAMID, cpr: a.CPR,
		markers: a.Markers, copies: a.Copies, makeCopies: a.MakeCopies, undoCopies: a.UndoCopies,
		uefiVars: a.UEFIVars, listen: a.Listen, journal: a.Journal, intent: a.Intent,
	})}
}

// incomingStart is a destination's start run, as live migration holds it.
type incomingStart struct{ r *startRun }

var _ livemigrate.Start = incomingStart{}

func (i incomingStart) Run(ctx context.Context) (func(context.Context), error) {
	return steps.Run(ctx, i.r.name, i.r.steps(), i.r.s.opts.AfterStep)
}
func (i incomingStart) Unit() string                        { return i.r.plan.Unit }
func (i incomingStart) PlugDisks(ctx context.Context) error { return i.r.plugDisks(ctx) }
func (i incomingStart) Sockets() vmstore.Paths              { return i.r.sock }
func (i incomingStart) Applied() *vmstore.Applied           { return i.r.app }
func (i incomingStart) ConsoleFIFO() string                 { return companion.FIFO(i.r.p, i.r.plan.Unit) }
func (i incomingStart) Op() *operation.Op                   { return i.r.op }
func (i incomingStart) Unlock(ctx context.Context)          { i.r.unlock(ctx) }
func (i incomingStart) Release() {
	if i.r.lk != nil {
		i.r.lk.Unlock()
		i.r.lk = nil
	}
}
