package livemigrate

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Host is what live migration needs of the supervisor: the state root, the
// VM's running view and QMP monitor, systemd, the guardian, the start
// pipeline (for a destination), and the lifecycle's clean-ups.
type Host interface {
	// State is the state root: paths, records, locks, autostart marks.
	State() vmstore.Store
	// Systemd is the connection to the systemd that runs the VMs' units.
	Systemd(ctx context.Context) (*units.Manager, error)
	// Logger is the one logger.
	Logger() *slog.Logger
	// AfterStep lets Options.AfterStep see a step not journaled here (a
	// local destination's hand-over).
	AfterStep(vm, step string)
	// View is the VM as it runs (with ErrNotRunning when no QEMU runs it).
	View(name string) (*vmstore.View, error)
	// QMPSession connects to the VM's command monitor, one client at a time.
	QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error)
	// Guard starts the VM's guardian, which settles the operation if its
	// command dies; stop ends it.
	Guard(ctx context.Context, name string) (stop func())
	// CheckPaths checks the paths a spec names against this host's places.
	CheckPaths(ctx context.Context, f *spec.File) error
	// StartIncoming is the start pipeline for a migration destination on
	// another host (local false) or this one.
	StartIncoming(f *spec.File, local bool, a StartArgs) Start
	// LastWords is the last error line QEMU wrote to its unit's journal.
	LastWords(ctx context.Context, unit string) string
	// ApplyRuntime gives the running QEMU (monitor c, command socket
	// qmpPath) vm's QMP-only settings.
	ApplyRuntime(ctx context.Context, c *qmp.Conn, vm *spec.VM, qmpPath string) error
	// ConsoleConfig is the VM's console log as it was last started.
	ConsoleConfig(name string) consolelog.Config
	// AfterStop cleans up after a QEMU that is gone: stale sockets and what
	// the host steps set up.
	AfterStop(ctx context.Context, name string) error
	// Disable drops the VM's autostart mark.
	Disable(ctx context.Context, name string) error
	// SyncBootUnit installs or removes the boot unit after the marks changed.
	SyncBootUnit(ctx context.Context) error
	// RunStateAt is the run state of the QEMU listening at sock ("" when
	// it does not answer).
	RunStateAt(ctx context.Context, sock string) qmp.RunState
	// RemoveUnit kills a unit nobody will use and clears its failed state.
	RemoveUnit(ctx context.Context, sd *units.Manager, unit string)
	// EndMove ends what a local migration made for the new QEMU beside
	// the old one's (its taps: startplan.Mover): the new QEMU's become
	// the VM's if it runs the guest (moved), else they go. Idempotent.
	EndMove(ctx context.Context, name string, moved bool) error
	// CPRTransfer says whether this host's QEMU can take a running guest's
	// RAM over in place (cpr-transfer), or why not.
	CPRTransfer(ctx context.Context) (bool, string)
	// Images is this host's image store (a copied disk's backing image,
	// by digest).
	Images() imagestore.Store
}

// Start is a destination QEMU's start through the supervisor's start
// pipeline (StartIncoming, StartIncomingLocal), with -incoming under its
// own unit, its sockets in an incoming directory until it takes over.
type Start interface {
	// Run runs the pipeline's steps; undo removes what they made.
	Run(ctx context.Context) (undo func(context.Context), err error)
	// Unit is the new QEMU's unit.
	Unit() string
	// PlugDisks is the pipeline's disks step, which a cpr-transfer
	// destination runs only once its QEMU has the source's state.
	PlugDisks(ctx context.Context) error
	// Sockets are where the new QEMU's sockets are until it takes over.
	Sockets() vmstore.Paths
	// Applied is what the VM's record says once the guest runs here.
	Applied() *vmstore.Applied
	// ConsoleFIFO is the FIFO the new QEMU writes its console log into.
	ConsoleFIFO() string
	// Op is the destination's journal on another host (nil on one host).
	Op() *operation.Op
	// Unlock ends the journal and lets the VM's lock go: the guest runs here.
	Unlock(ctx context.Context)
	// Release lets the VM's lock go if it is still held, leaving the
	// journal to the guardian.
	Release()
}

// StartArgs are what the source tells a migration destination, for its
// start.
type StartArgs struct {
	Accel    spec.Accel
	CPUModel string
	CPUMasks []string
	Machine  string // the source's versioned machine type ("" from older sources)
	RAMID    string // the source's RAM block name ("" from older sources)
	// CPR: a local destination that takes the guest's RAM in place
	// (cpr-transfer, cpr.go): its QEMU waits on a cpr channel, and the
	// disks step is left to PlugDisks.
	CPR        bool
	IDs        identity.IDs // the source's UUID and generation id
	SourceFile string
	From       string
	Markers    map[string]string // disk file -> the source's marker beside it
	// Copies are the disk files this destination takes a copy of
	// (storage_in.go): the shared-storage check skips them, and the
	// disk-copies step makes them (MakeCopies; UndoCopies removes them).
	Copies     map[string]bool
	MakeCopies func(ctx context.Context) error
	UndoCopies func(ctx context.Context)
	UEFIVars   []byte
	// Listen makes QEMU listen for the stream (the incoming step).
	Listen func(ctx context.Context) error
	// Journal is the kind of a destination's operation on another host,
	// and Intent its intent: the unit, whether the VM had a state
	// directory here, and (from the record step) what its commit records.
	Journal operation.Kind
	Intent  func(unit string, existed bool, app *vmstore.Applied, raw []byte) any
}

// Migrator runs live migrations of the VMs of one state root: the source
// side (Migrate, Cancel), the destination (Receive) and their recovery.
type Migrator struct {
	k   *operation.Kernel
	h   Host
	log *slog.Logger
}

// New returns a Migrator whose operations run through k.
func New(k *operation.Kernel, h Host) *Migrator {
	return &Migrator{k: k, h: h, log: h.Logger()}
}

// Register registers the recoverers of a migration's two sides with k.
func Register(k *operation.Kernel, h Host) {
	mg := New(k, h)
	k.Register(KindOut, mg.recoverMigrateOut)
	k.Register(KindIn, mg.recoverMigrateIn)
	k.Register(KindOutStorage, mg.recoverMigrateOutStorage)
	k.Register(KindInStorage, mg.recoverMigrateInStorage)
}

func (mg *Migrator) paths(name string) vmstore.Paths { return mg.h.State().Paths(name) }

// Timeouts for the parts of vmsup's own work (as the supervisor's).
const (
	qmpConnectTimeout = 3 * time.Second
	// monitorCommandTimeout bounds a command on a migration's event
	// monitor: QMP's 500 ms default failed a local migration's first
	// query-status on a loaded 2-core host (a TCG guest booting beside
	// other tests), before anything had moved.
	monitorCommandTimeout = 5 * time.Second
	quitTimeout           = 5 * time.Second
	killTimeout           = 10 * time.Second
)

// Error is a failed migration; the guest still runs where Running says.
type Error struct {
	VM      string
	Step    string
	Running string // "source", "destination", "source (paused)", "none"
	Err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("vm %q: migrate: %s: %v (the guest runs on: %s)", e.VM, e.Step, e.Err, e.Running)
}
func (e *Error) Unwrap() error { return e.Err }

// VMName says which VM the error is about.
func (e *Error) VMName() string { return e.VM }

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

// stepNames are steps as AfterStep sees them.
func stepNames(steps ...operation.Step) []string {
	out := make([]string, len(steps))
	for i, s := range steps {
		out[i] = string(s)
	}
	return out
}
