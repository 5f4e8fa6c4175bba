package livemigrate

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// StartArgs are what the source tells a migration destination, for its
// start (env.StartIncoming).
type StartArgs = machine.IncomingArgs

// Migrator runs live migrations of the VMs of one state root: the source
// side (Migrate, Cancel), the destination (Receive) and their recovery.
type Migrator struct {
	k   *operation.Kernel
	env *machine.Env // the lifecycle: state, systemd, QMP, the start pipeline
	log *slog.Logger
}

// New returns a Migrator whose operations run through k, in env.
func New(k *operation.Kernel, env *machine.Env) *Migrator {
	return &Migrator{k: k, env: env, log: env.Opts().Logger}
}

// Register registers the recoverers of a migration's two sides with k.
func Register(k *operation.Kernel, env *machine.Env) {
	mg := New(k, env)
	k.Register(KindOut, mg.recoverMigrateOut)
	k.Register(KindIn, mg.recoverMigrateIn)
	k.Register(KindOutStorage, mg.recoverMigrateOutStorage)
	k.Register(KindInStorage, mg.recoverMigrateInStorage)
	k.Register(KindMove, mg.recoverMove)
	k.Register(KindInMove, mg.recoverMoveIn)
}

func (mg *Migrator) paths(name string) vmstore.Paths { return mg.env.State().Paths(name) }

// afterStep lets Options.AfterStep see a step not journaled here (a local
// destination's hand-over).
func (mg *Migrator) afterStep(vm, step string) {
	if f := mg.env.Opts().AfterStep; f != nil {
		f(vm, step)
	}
}

// endMoveTaps ends what a local migration made for the new QEMU beside
// the old one's (its taps: startplan.Mover): the new QEMU's become the
// VM's if it runs the guest (moved), else they go. Idempotent.
func (mg *Migrator) endMoveTaps(ctx context.Context, name string, moved bool) error {
	return startplan.EndMove(ctx, name, moved, mg.env.HostConcerns()...)
}

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

// Error is a failed migration, or move; the guest still runs (a moved VM
// is defined) where Running says.
type Error struct {
	VM      string
	Op      string // "" (a migration) or "move"
	Step    string
	Running string // "source", "destination", "source (paused)", "none"
	Err     error
}

func (e *Error) Error() string {
	if e.Op == "move" {
		return fmt.Sprintf("vm %q: move: %s: %v (the VM is on: %s)", e.VM, e.Step, e.Err, e.Running)
	}
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
