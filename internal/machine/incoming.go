package machine

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// IncomingArgs are what the source tells a migration destination, for its
// start (internal/ops/livemigrate fills them in).
type IncomingArgs struct {
	Accel    spec.Accel
	CPUModel string
	CPUMasks []string
	Machine  string // the source's versioned machine type ("" from older sources)
	RAMID    string // the source's RAM block name ("" from older sources)
	// CPR: a local destination that takes the guest's RAM in place
	// (cpr-transfer): its QEMU waits on a cpr channel, and the disks step
	// is left to PlugDisks.
	CPR        bool
	IDs        identity.IDs // the source's UUID and generation id
	SourceFile string
	From       string
	Markers    map[string]string // disk file -> the source's marker beside it
	// Copies are the disk files this destination takes a copy of: the
	// shared-storage check skips them, and the disk-copies step makes
	// them (MakeCopies; UndoCopies removes them).
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

// Incoming is a migration destination's start: the start pipeline in
// StartIncoming (or StartIncomingLocal) mode, run and handed over by
// live migration.
type Incoming struct{ r *startRun }

// StartIncoming prepares the start of a migration destination of f (on
// this host beside the source when local); Run runs it.
func (s *Env) StartIncoming(f *spec.File, local bool, a IncomingArgs) *Incoming {
	mode := StartIncoming
	if local {
		mode = StartIncomingLocal
	}
	return &Incoming{s.newStart(f, mode, a)}
}

// Run runs the pipeline's steps; undo removes what they made.
func (i *Incoming) Run(ctx context.Context) (func(context.Context), error) {
	return steps.Run(ctx, i.r.name, i.r.steps(), i.r.s.opts.AfterStep)
}

// Unit is the new QEMU's unit.
func (i *Incoming) Unit() string { return i.r.plan.Unit }

// PlugDisks is the pipeline's disks step, which a cpr-transfer destination
// runs only once its QEMU has the source's state.
func (i *Incoming) PlugDisks(ctx context.Context) error { return i.r.plugDisks(ctx) }

// Sockets are where the new QEMU's sockets are until it takes over.
func (i *Incoming) Sockets() vmstore.Paths { return i.r.sock }

// Applied is what the VM's record says once the guest runs here.
func (i *Incoming) Applied() *vmstore.Applied { return i.r.app }

// ConsoleFIFO is the FIFO the new QEMU writes its console log into.
func (i *Incoming) ConsoleFIFO() string { return companion.FIFO(i.r.p, i.r.plan.Unit) }

// Op is the destination's journal on another host (nil on one host).
func (i *Incoming) Op() *operation.Op { return i.r.op }

// Unlock ends the journal and lets the VM's lock go: the guest runs here.
func (i *Incoming) Unlock(ctx context.Context) { i.r.unlock(ctx) }

// Release lets the VM's lock go if it is still held, leaving the journal
// to the guardian.
func (i *Incoming) Release() {
	if i.r.lk != nil {
		i.r.lk.Unlock()
		i.r.lk = nil
	}
}
