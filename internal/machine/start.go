package machine

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/diskfds"
	"github.com/vmsup/vmsup/internal/lifecycle/diskprep"
	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The one start pipeline: up, restart, autostart and the migration
// destination all start QEMU through it. It is a list of named steps, each
// with its undo; a failed step undoes the ones before it. The mode says
// what the start makes; each host concern (storage, network, confinement)
// and the companion units add their own steps, and their unit and argv
// options as data (a startplan.Plan, prepare.go lists them), which the
// argv and unit steps apply in one place.

// StartMode is what a start makes.
type StartMode = startplan.Mode

// Start modes.
const (
	// StartFresh: a new QEMU running the guest from its file (up).
	StartFresh = startplan.Fresh
	// StartIncoming: a migration destination on another host than the
	// source: QEMU waits with -incoming, the host is made ready as for up.
	StartIncoming = startplan.Incoming
	// StartIncomingLocal: a migration destination on the source's host: the
	// new QEMU runs under the VM's other unit name and reuses the host
	// resources the running one has (grants, namespace), with taps of its
	// own on the same bridges (vmnet's move.go).
	StartIncomingLocal = startplan.IncomingLocal
)

// Steps of a start, in order, as AfterStep sees them. The host concerns'
// steps come between state-dir and argv: hugepages, vsock, storage,
// credentials, net-check, netns (with CNI NICs), `nic "NAME"` for each tap
// NIC, hostdevs, confine (each only where the VM needs it); a local
// migration destination has reuse instead. The companions' come between
// record and unit.
const (
	StepValidate = "validate" // resolve the accelerator and CPU; checks that touch nothing
	StepLock     = "lock"     // the VM's lock (a local destination runs under the source's)
	StepCheck    = "check"    // the unit's state: an existing VM is left alone
	StepStateDir = "state-dir"
	StepStorage  = diskprep.Step
	StepNetCheck = nics.StepCheck
	StepNetns    = nics.StepNetns
	StepConfine  = confine.Step
	StepReuse    = "reuse"       // a local destination: the running QEMU's host resources
	StepCopies   = "disk-copies" // a destination on another host: the images it takes a copy of, made empty
	StepArgv     = "argv"
	StepRecord   = "record"
	StepConsole  = companion.StepConsole  // the console logger
	StepTPM      = companion.StepTPM      // the VM's swtpm
	StepVirtioFS = companion.StepVirtioFS // the shares' virtiofsd
	StepUnit     = "unit"
	StepDisks    = diskfds.Step // the disks QEMU gets as descriptors, while paused
	StepConfirm  = "confirm"    // fresh: QEMU answers QMP and runs
	StepIncoming = "incoming"   // destination: QEMU listens for the stream
	StepRestore  = "restore"    // from a memory snapshot: QEMU reads the state, the guest resumes
)

// StartSteps lists the steps a start of f runs in mode: what AfterStep sees,
// in order.
func (s *Env) StartSteps(f *spec.File, mode StartMode) []string {
	r := s.newStart(f, mode, IncomingArgs{})
	var names []string
	for _, st := range r.steps() {
		names = append(names, st.Name)
	}
	return names
}

// startRun is one start: what its steps share.
type startRun struct {
	s    *Env
	mode StartMode
	f    *spec.File
	name string
	p    vmstore.Paths // the VM's paths
	sock vmstore.Paths // where this QEMU's sockets go: p, or a fresh incoming directory
	sd   *units.Manager
	lk   *operation.Lock
	app  *vmstore.Applied
	// plan is what the concerns' steps share and decide; plan.Unit is the
	// unit this QEMU runs as.
	plan startplan.Plan
	argv []string
	// bootDisks are the disks left off argv, plugged by the disks step.
	bootDisks []qemuargs.BootDisk
	res       UpResult
	in        IncomingArgs
	// locked: the caller holds the VM's lock (restart, recovery).
	locked bool
	// restore: a fresh start resumes the guest from this memory state
	// file (a snapshot's) instead of booting it (snapshot_restore.go).
	restore string
	// op journals a destination on another host (its receiver may die),
	// and its guardian settles it then.
	op        *operation.Op
	stopGuard func()
	prev      struct {
		dir      bool
		app, raw []byte
	}
}

func (s *Env) newStart(f *spec.File, mode StartMode, in IncomingArgs) *startRun {
	name := f.VM.Name
	r := &startRun{s: s, mode: mode, f: f, name: name, p: s.Paths(name), in: in, res: UpResult{VM: name}}
	r.sock = r.p
	r.plan = startplan.Plan{Mode: mode, Paths: r.p}
	r.app = &vmstore.Applied{Name: name, SourceFile: absPath(f.Path), Spec: vmstore.Canonical(&f.VM)}
	switch mode {
	case StartFresh:
		r.plan.Unit = s.state.UnitOf(name) // after a local migration, not vmsup-NAME.service
	case StartIncoming:
		r.plan.Unit = vmstore.UnitName(name)
		r.app.SourceFile, r.app.MigratedFrom = in.SourceFile, in.From
	case StartIncomingLocal:
		r.plan.Unit = vmstore.AltUnit(name, s.state.UnitOf(name))
		r.app.SourceFile, r.app.MigratedFrom = in.SourceFile, in.From
	}
	return r
}

// steps is the pipeline for this start's mode.
func (r *startRun) steps() []step {
	steps := []step{{Name: StepValidate, Do: r.validate}}
	if r.mode != StartIncomingLocal && !r.locked {
		steps = append(steps, step{Name: StepLock, Do: r.takeLock, Undo: r.unlock})
	}
	steps = append(steps,
		step{Name: StepCheck, Do: r.check},
		step{Name: StepStateDir, Do: r.stateDir, Undo: r.undoStateDir})
	if r.in.MakeCopies != nil {
		steps = append(steps, step{Name: StepCopies, Do: r.in.MakeCopies, Undo: r.in.UndoCopies})
	}
	if r.mode == StartIncomingLocal {
		steps = append(steps, step{Name: StepReuse, Do: r.reuse})
		steps = append(steps, startplan.MoveSteps(r.f, &r.plan, r.s.HostConcerns()...)...)
	} else {
		steps = append(steps, startplan.Steps(r.f, &r.plan, r.s.HostConcerns()...)...)
	}
	steps = append(steps,
		step{Name: StepArgv, Do: r.makeArgv},
		step{Name: StepRecord, Do: r.record, Undo: r.undoRecord})
	steps = append(steps, r.s.companions().Steps(r.f, &r.plan)...)
	steps = append(steps, step{Name: StepUnit, Do: r.startUnit, Undo: r.removeUnit},
		step{Name: StepDisks, Do: func(ctx context.Context) error {
			if r.in.CPR {
				return nil // its QEMU answers once the source sent its state
			}
			return r.plugDisks(ctx)
		}})
	if r.mode == StartFresh && r.restore != "" {
		return append(steps, step{Name: StepRestore, Do: r.restoreState})
	}
	if r.mode == StartFresh {
		steps = append(steps, step{Name: StepConfirm, Do: func(ctx context.Context) error {
			return r.s.confirmRunning(ctx, r.sd, r.name, r.app.Accel, len(r.bootDisks) > 0)
		}})
		if livesettings.HasRuntime(&r.f.VM) {
			steps = append(steps, step{Name: StepLive, Do: r.liveStep})
		}
		return steps
	}
	return append(steps, step{Name: StepIncoming, Do: func(ctx context.Context) error {
		if r.in.Listen == nil {
			return errors.New("no listener for the migration stream")
		}
		return r.in.Listen(ctx)
	}})
}

// validate resolves what the VM runs with here and checks what can be
// checked without touching anything.
func (r *startRun) validate(ctx context.Context) (err error) {
	s := r.s
	if s.opts.Self == "" {
		return ErrNoSelf
	}
	var cpu CPUChoice
	if r.mode == StartFresh {
		r.app.Accel, r.app.AccelReason, cpu, err = s.resolveHost(r.f)
		r.res.Accel, r.res.AccelReason = r.app.Accel, r.app.AccelReason
		if err != nil {
			return err
		}
	} else {
		r.app.Accel, cpu = r.in.Accel, CPUChoice{r.in.CPUModel, r.in.CPUMasks}
	}
	if r.mode == StartIncoming {
		if err := s.checkIncoming(r.f, r.in); err != nil {
			return err
		}
		if err := s.checkIncomingCPU(r.in.Accel, r.f.VM.CPUModel, cpu); err != nil {
			return err
		}
	}
	if r.mode != StartFresh && r.f.VM.HasVirtioFS() {
		return companion.ErrMigrateVirtioFS
	}
	r.app.CPUModel, r.app.CPUMasks = cmp.Or(r.f.VM.CPUModel, cpu.Model), cpu.Masks
	r.plan.Accel = r.app.Accel
	r.sd, err = s.Systemd(ctx)
	return err
}

// checkIncoming is what a destination on another host checks before taking
// anything: KVM if the source uses it, the files the spec names, and that
// the disks are the source's (shared storage).
func (s *Env) checkIncoming(f *spec.File, in IncomingArgs) error {
	h := s.hostFacts()
	if in.Accel == spec.AccelKVM && !h.KVMOpenable {
		return fmt.Errorf("the source runs it under kvm but here %s", h.KVMUnusable)
	}
	if err := checkHost(f, h, s.opts.QEMU); err != nil {
		return err
	}
	for i, disk := range f.VM.Disks {
		mk, ok := in.Markers[disk.File]
		if !ok || in.Copies[disk.File] {
			continue // the source could not mark it (it exists here: checkHost), or it is copied here
		}
		if _, err := os.Stat(mk); err != nil {
			return fmt.Errorf("disk[%d] %s: not on storage shared with the source (its marker %s is not visible here); "+
				"only writable file disks are copied to the destination: put it on storage both hosts see", i, disk.File, mk)
		}
	}
	return nil
}

// checkIncomingCPU: the destination runs the guest with the source's CPU
// model and masks (the guest must see the same CPU); this host's KVM must
// start that model with those masks.
func (s *Env) checkIncomingCPU(accel spec.Accel, specModel string, cpu CPUChoice) error {
	if accel != spec.AccelKVM || s.opts.Host != nil && s.opts.HostCaps == nil {
		return nil
	}
	c, err := s.HostCaps(context.Background(), false)
	if err != nil {
		return err
	}
	model := cmp.Or(specModel, cpu.Model, "host")
	m, ok := c.KVM.Mode(model)
	if !ok {
		return nil // a named model: not probed, QEMU decides
	}
	if !m.Starts {
		return fmt.Errorf("-cpu %s does not start under KVM on this host (%s)", model, m.Error)
	}
	for _, need := range m.Masks {
		if !slices.Contains(cpu.Masks, need) {
			return fmt.Errorf("this host's KVM needs %s masked for -cpu %s, which the source does not mask: the guest would see its CPU change; "+
				"migrate between hosts whose KVMs take the same CPU, or give the VM a named cpu_model", need, model)
		}
	}
	return nil
}

// takeLock takes the VM's lock and settles what a killed command left; a
// destination on another host then journals itself, so that the next
// command here tears it down or records it if its receiver dies.
func (r *startRun) takeLock(ctx context.Context) (err error) {
	op := "up"
	if r.mode != StartFresh {
		op = "migrate-receive"
	}
	var note string
	if r.lk, note, err = r.s.ops.Lock(ctx, r.name, op); err != nil {
		return err
	}
	if r.mode == StartIncoming {
		// The guardian first: no moment with a journal and nobody to settle it.
		r.op, r.stopGuard, err = r.s.beginGuardedOp(ctx, r.name, r.in.Journal, r.incomingIntent())
	}
	if err != nil {
		r.unlock(ctx)
		return err
	}
	r.res.Note = note
	return nil
}

// unlock ends a destination's journal (all it made is undone by now), then
// lets the VM's lock go.
func (r *startRun) unlock(context.Context) {
	if r.op != nil {
		r.op.End()
		r.stopGuard() // after the journal: a kill between the two leaves a guardian with nothing to do
		r.op = nil
	}
	if r.lk != nil {
		r.lk.Unlock()
		r.lk = nil
	}
}

// incomingIntent is a destination's journal before its record step: what
// its commit records is not known yet.
func (r *startRun) incomingIntent() any {
	_, err := os.Stat(r.p.Dir)
	return r.in.Intent(r.plan.Unit, err == nil, nil, nil)
}

// settledStatus is the unit's status once no start or stop of it is under
// way: a killed command's unit may still be activating (we hold the lock,
// so no live command's is), and the next command settles what it left
// rather than refusing it. The wait is bounded as a start's confirm is.
func (r *startRun) settledStatus(ctx context.Context) (units.Status, error) {
	wctx, cancel := context.WithTimeout(ctx, caps.ConfirmTimeout(spec.AccelAuto, caps.LoadFactor()))
	defer cancel()
	if st, err := r.sd.WaitSettled(wctx, r.plan.Unit); err != nil && ctx.Err() == nil {
		return units.Status{}, fmt.Errorf("unit %s is still %s: %w", r.plan.Unit, st, err)
	}
	return r.sd.LoadedStatus(ctx, r.plan.Unit)
}

// qemuRunState is the run state of the unit's QEMU, waiting (bounded as a
// start's confirm) for it to open its monitor: a unit a killed start had
// just made may not have yet, and taken for a running VM it stayed paused
// at -S for good ("" when it never answers or its unit ends).
func (r *startRun) qemuRunState(ctx context.Context) qmp.RunState {
	wctx, cancel := context.WithTimeout(ctx, ConfirmTimeout(spec.AccelAuto))
	defer cancel()
	for {
		if rs := r.s.RunStateAt(wctx, r.p.QMP); rs != "" {
			return rs
		}
		if ended, err := r.sd.Ended(wctx, r.plan.Unit); err != nil || ended {
			return ""
		}
		select {
		case <-wctx.Done():
			return ""
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// check reads the unit's state: a fresh start leaves an existing VM as it
// is (errStopHere) and clears a crashed one; a destination refuses a unit
// that is active here.
func (r *startRun) check(ctx context.Context) error {
	if r.mode == StartIncoming {
		if cur := r.s.state.UnitOf(r.name); cur != r.plan.Unit {
			if st, err := r.sd.Status(ctx, cur); err == nil && !st.Gone() {
				return fmt.Errorf("already running on this host as %s", cur)
			}
		}
	}
	st, err := r.settledStatus(ctx)
	if err != nil {
		return err
	}
	if r.mode != StartFresh {
		switch {
		case st.Exists && st.ActiveState == "failed":
			return r.sd.ResetFailed(ctx, r.plan.Unit)
		case st.Exists && st.ActiveState != "inactive":
			return fmt.Errorf("unit %s is %s on this host", r.plan.Unit, st.ActiveState)
		}
		return nil
	}
	if st.Gone() {
		defer func() { r.plan.Unit = vmstore.UnitName(r.name) }() // a fresh start uses the usual name
	}
	switch {
	case st.Exists && st.ActiveState == "failed":
		r.res.Note = joinNote(r.res.Note, "previous run crashed: "+st.ExitReason())
		return r.sd.ResetFailed(ctx, r.plan.Unit)
	case st.Exists && st.ActiveState == "active" && r.qemuRunState(ctx) == qmp.RunPrelaunch:
		// A start died between its unit and confirm steps (we hold the
		// lock: no start is under way): its QEMU never ran the guest and
		// may lack disks. Stop it and start afresh.
		if err := r.s.stopPrelaunch(ctx, r.sd, r.name, r.plan.Unit); err != nil {
			return err
		}
		r.res.Note = joinNote(r.res.Note, "a start that died before the guest ran was stopped")
		r.plan.Unit = vmstore.UnitName(r.name)
		return nil
	case st.Exists && st.ActiveState != "inactive":
		if st.ActiveState != "active" {
			return fmt.Errorf("unit %s is %s; try again when it settles", r.plan.Unit, st.ActiveState)
		}
		old, err := r.s.state.ReadApplied(r.name)
		r.res.Action = Changed
		if err == nil && RunsFile(old, &r.f.VM) {
			r.res.Action = Unchanged
		}
		if err == nil {
			r.res.Accel, r.res.AccelReason = old.Accel, old.AccelReason
		}
		// The VM exists: report it as it is, whatever its state, and touch
		// nothing (no later step, no undo).
		if err := r.s.reportExisting(ctx, r.sd, r.name, r.plan.Unit, &r.res); err != nil {
			return err
		}
		return errStopHere
	}
	return nil
}

// stateDir makes the VM's state directory (an old one keeps its files, and
// gets them back on failure) and, for a destination, the directory its
// QEMU's sockets go to until it takes over.
func (r *startRun) stateDir(ctx context.Context) error {
	p, f := r.p, r.f
	if r.mode != StartIncoming {
		tree, err := snapshottree.Load(p.Snapshots())
		if err != nil {
			return err
		}
		r.plan.Boot.Tree = tree
		if app, err := r.s.state.ReadApplied(r.name); err == nil {
			r.plan.Boot.Moved = diskprep.MovedFor(f, app.Moved)
		}
	}
	if r.mode != StartIncomingLocal {
		if r.mode == StartFresh {
			var err error
			if r.plan.Boot.Carried, err = r.s.disks().Carried(f); err != nil {
				return err
			}
		}
		_, err := os.Stat(p.Dir)
		r.prev.dir = err == nil
		r.prev.app, _ = os.ReadFile(p.State)
		r.prev.raw, _ = os.ReadFile(p.Spec)
		if err := os.MkdirAll(p.Dir, 0o700); err != nil {
			return err
		}
		if err := os.Chmod(p.Dir, 0o700); err != nil {
			return err
		}
		if err := p.RemoveSockets(); err != nil {
			return err
		}
	}
	if err := r.makeEventLog(); err != nil {
		return err
	}
	// A fresh start's UEFI variable store is made from its template by the
	// boot-files step (internal/lifecycle/confine), from the checked descriptor.
	if r.mode == StartIncoming {
		if f.VM.Boot.Firmware == spec.FirmwareUEFI {
			// The flash contents also travel in the stream (pflash is
			// RAM-backed); the file is what later writes go to.
			if err := os.WriteFile(p.UEFIVars, r.in.UEFIVars, 0o600); err != nil {
				return fmt.Errorf("UEFI variable store: %w", err)
			}
		}
		// The source's console history replaces this host's old one.
		for _, old := range consolelog.Files(companion.Config(p, &f.VM)) {
			if err := os.Remove(old); err != nil {
				return err
			}
		}
	}
	if r.mode == StartFresh {
		return nil
	}
	// A fresh directory each time: a QEMU unlinks the socket paths it bound
	// when it exits, and the previous destination (the source now) bound
	// its sockets under an incoming directory too.
	in := filepath.Join(p.Dir, "incoming-"+randHex(6))
	r.sock = vmstore.Paths{Dir: in, QMP: filepath.Join(in, "qmp.sock"), Events: filepath.Join(in, "events.sock"),
		Console: filepath.Join(in, "console.sock"), Agent: filepath.Join(in, "qga.sock")}
	return os.Mkdir(in, 0o700)
}

// makeEventLog makes the files of the new QEMU's event log
// (qemuargs.Options.EventLog): a fresh start's replaces the last one; a
// migration destination's is its own until the source's QEMU is gone.
func (r *startRun) makeEventLog() error {
	base := r.p.EventLog()
	if r.mode != StartFresh {
		base += "-" + randHex(6)
	}
	if r.mode == StartFresh {
		// A QEMU whose stop-post never ran (the host went down) left its
		// events here: keep them before the new one starts anew.
		_ = r.s.archiveEvents(r.name, base)
	}
	if err := os.WriteFile(base+".in", []byte(qemuargs.EventLogInput), 0o600); err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	if err := os.WriteFile(base+".out", nil, 0o600); err != nil {
		return fmt.Errorf("event log: %w", err)
	}
	r.app.EventLog = base
	return nil
}

func (r *startRun) undoStateDir(context.Context) {
	if r.sock.Dir != r.p.Dir {
		os.RemoveAll(r.sock.Dir)
	}
	if r.mode != StartFresh && r.app.EventLog != "" {
		os.Remove(r.app.EventLog + ".in")
		os.Remove(r.app.EventLog + ".out")
	}
	switch {
	case r.mode == StartIncomingLocal:
	case !r.prev.dir:
		r.p.RemoveAll()
	case r.mode == StartIncoming:
		vmstore.Restore(r.p.State, r.prev.app)
		vmstore.Restore(r.p.Spec, r.prev.raw)
	}
}

// reuse gives a local destination's unit what the running QEMU's host
// steps made: its confinement (user, sandbox, profile), its network hooks
// and namespace, its disks' devices. Nothing is made again.
func (r *startRun) reuse(context.Context) error {
	return startplan.Reuse(r.f, &r.plan, r.s.HostConcerns()...)
}

func (r *startRun) makeArgv(context.Context) (err error) {
	r.resolveIdentity()
	if err := r.resolveMachine(); err != nil {
		return err
	}
	boot := r.plan.Boot.File(r.f)
	if r.mode == StartIncomingLocal {
		boot = withoutForwards(boot) // their ports are the old QEMU's until it quits (forwards.go)
	}
	var final *qemuargs.Options
	opts := append(r.plan.ArgvOptions(), func(o *qemuargs.Options) {
		o.EventLog, o.Machine = r.app.EventLog, r.app.Machine
		o.UUID, o.GenID = r.app.UUID, r.app.GenID
		o.DisksByFD, o.StateDir = true, r.p.Dir
		final = o
	})
	if r.restore != "" {
		opts = append(opts, func(o *qemuargs.Options) { o.Incoming = true })
	}
	if r.mode != StartFresh {
		opts = append(opts, func(o *qemuargs.Options) {
			o.Incoming, o.RAMID = true, r.in.RAMID
			if r.in.CPR {
				o.CPRSocket = r.sock.CPR()
			}
			o.QMPSocket, o.EventSocket, o.ConsoleSocket, o.AgentSocket = r.sock.QMP, r.sock.Events, r.sock.Console, r.sock.Agent
			o.VNCSocket = r.sock.VNC()
		})
	}
	r.argv, err = r.s.argv(boot, r.app.Accel, CPUChoice{r.app.CPUModel, r.app.CPUMasks}, opts...)
	if err != nil {
		return err
	}
	if r.bootDisks, err = qemuargs.BootDisks(&boot.VM, *final); err != nil {
		return fmt.Errorf("%s: %w", boot.Path, err)
	}
	if n := argvBytes(r.argv); n > maxArgv {
		// systemd carries it in one D-Bus message and asserts on huge
		// properties: refuse here, with the spec's limits as the real bound.
		return fmt.Errorf("the QEMU command line would be %d bytes, more than %d", n, maxArgv)
	}
	r.app.Argv = r.argv
	ram := qemuargs.RAMOf(&boot.VM, *final)
	r.app.RAM = &ram
	r.app.VsockCID, r.app.Hugetlbfs = r.plan.VsockCID, r.plan.Hugetlbfs
	diskprep.Record(r.app, &boot.VM, r.plan.Boot.Carried)
	r.app.Moved = r.plan.Boot.Moved
	return nil
}

// maxArgv bounds QEMU's command line (a large VM's is a few KiB).
const maxArgv = 256 << 10

func argvBytes(argv []string) int {
	n := 0
	for _, a := range argv {
		n += len(a) + 1
	}
	return n
}

// record writes what the VM runs with; a destination's record is written
// when the guest runs there (commit).
func (r *startRun) record(context.Context) error {
	if r.op != nil {
		// What the receiver's commit would record, for recovery.
		return r.op.SetIntent(r.in.Intent(r.plan.Unit, r.prev.dir, r.app, r.f.Raw))
	}
	if r.mode != StartFresh {
		return nil
	}
	r.app.StartedAt = time.Now().UTC()
	r.app.Generation = 1
	if old, err := r.s.state.ReadApplied(r.name); err == nil {
		r.app.Generation = old.Generation + 1
	}
	if livesettings.HasRuntime(&r.f.VM) {
		r.app.SetVM(livesettings.WithoutRuntime(r.f.VM)) // until StepLive gives them
	}
	if err := r.s.state.ClearPending(r.name); err != nil { // this QEMU runs the file
		return err
	}
	os.Remove(r.p.KillMark()) // a kill whose stop-post never ran is not this QEMU's
	return r.s.state.WriteApplied(r.app, r.f.Raw)
}

func (r *startRun) undoRecord(context.Context) {
	if r.mode == StartFresh && r.prev.dir {
		vmstore.Restore(r.p.State, r.prev.app)
		vmstore.Restore(r.p.Spec, r.prev.raw)
	}
}

// startUnit starts QEMU's unit with the options the host steps returned.
func (r *startRun) startUnit(ctx context.Context) error {
	u := r.s.unitFor(r.f, r.argv, r.app.Accel)
	u.Name = r.plan.Unit
	r.plan.ApplyUnit(&u)
	r.s.bindHooks(&u)
	for _, f := range []string{r.app.EventLog + ".in", r.app.EventLog + ".out"} {
		if err := vmstore.ChownLike(f, r.p.Dir); err != nil { // QEMU opens both as its user
			return err
		}
	}
	if r.mode != StartFresh {
		// QEMU binds its sockets there: same owner as the state directory
		// (the host steps may have given that to an unprivileged QEMU user).
		if err := vmstore.ChownLike(r.sock.Dir, r.p.Dir); err != nil {
			return err
		}
	}
	if err := r.sd.Start(ctx, u); err != nil {
		// A QEMU that refuses at once can fail the start job itself: say
		// why, as confirm would, and leave no failed unit behind.
		err = fmt.Errorf("%w: %s", err, r.s.LastWords(ctx, u.Name))
		r.removeUnit(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// stopPrelaunch stops a QEMU whose start died before the guest ran, and
// releases what its host steps made.
func (s *Env) stopPrelaunch(ctx context.Context, sd *units.Manager, name, unit string) error {
	uctx, cancel := context.WithTimeout(ctx, undoTimeout)
	defer cancel()
	sd.KillAndWait(uctx, unit)
	if st, err := sd.LoadedStatus(uctx, unit); err == nil && st.Exists && st.ActiveState == "failed" {
		_ = sd.ResetFailed(uctx, unit)
	}
	if err := s.hostTeardown(ctx, name); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("release the host resources of a start that died: %w", err))
	}
	return nil
}

// plugDisks gives the paused QEMU the disks argv left out, as
// descriptors (internal/lifecycle/diskfds); the unit step's undo stops it if this
// fails.
func (r *startRun) plugDisks(ctx context.Context) error {
	if len(r.bootDisks) == 0 {
		return nil
	}
	unit := r.plan.Unit
	ended := func(ctx context.Context) (bool, error) { return r.sd.Ended(ctx, unit) }
	words := func() string { return r.s.LastWords(context.WithoutCancel(ctx), unit) }
	c, err := diskfds.Dial(ctx, r.sock.QMP, ended, words, qmp.WithoutSymlink(), qmp.WithLogger(r.s.opts.Logger))
	if err != nil {
		return err
	}
	defer c.Close()
	return diskfds.Boot(ctx, c, &r.plan.Boot.File(r.f).VM, r.bootDisks, r.s.Places().OpenDisk,
		r.plan.Boot.OwnImages(&r.f.VM), r.mode == StartFresh && r.restore == "")
}

func (r *startRun) removeUnit(ctx context.Context) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	r.sd.KillAndWait(uctx, r.plan.Unit)
}

// joinNote joins two notes for the user ("" is none).
func joinNote(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}

// bindHooks tells vmsup's stop hooks which unit they belong to, so that
// they act only for the VM's current QEMU (StopHook), and runs the stop
// hook only while QEMU lives: systemd runs ExecStop= after QEMU ended too
// (every vmsup down), and vmsup's own start there cost ten milliseconds
// of each stop.
func (s *Env) bindHooks(u *units.Unit) {
	for _, cmds := range [][][]string{u.ExecStop, u.ExecStopPost} {
		for i, c := range cmds {
			if len(c) > 1 && c[0] == s.opts.Self {
				cmds[i] = append(c[:len(c)-1:len(c)-1], "--unit", u.Name, c[len(c)-1])
			}
		}
	}
	for i, c := range u.ExecStop {
		if len(c) > 1 && c[0] == s.opts.Self {
			u.ExecStop[i] = units.WhileMainRuns(c)
		}
	}
}

// randHex is n random bytes in hex, for names no other start picks.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
