package machine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/lifecycle/companion"
	"github.com/vmsup/vmsup/internal/lifecycle/diskprep"
	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// UpAction is what Up did with one VM.
type UpAction string

// Up outcomes.
const (
	Started   UpAction = "started"   // was not running; now runs
	Unchanged UpAction = "unchanged" // already running with this spec; left alone
	Changed   UpAction = "changed"   // running with a different spec; reported, not restarted
)

// UpResult reports one VM of an Up call.
type UpResult struct {
	VM          string
	Action      UpAction
	Accel       spec.Accel
	AccelReason string
	Note        string // e.g. "previous run crashed: killed by signal KILL"
	// State is the VM's state after Up: running, or for a VM that already
	// existed, the state Up found and left it in (paused, ...).
	State vmstore.State
}

// Validate checks files as Up would, without starting anything: each parses,
// names are unique across files, what they refer to lies in this host's
// places (CheckPaths) and exists on this host.
// It is ValidateContext without a deadline of the caller's.
func (s *Env) Validate(files ...*spec.File) error {
	return s.ValidateContext(context.Background(), files...)
}

// ValidateContext is Validate bounded by ctx (each check has its own bound
// too: storage probes, NIC targets, the confinement's image rule). Every
// check runs and the error names every problem, one line each in file
// order (a *spec.Errors per file, files joined), except the checks that
// build on the others: the argv and the confinement check need everything
// else sound (they would say again, in their words, what another check
// said). A file from spec.ParsePartial brings its own errors; the host
// checks skip the fields they concern.
func (s *Env) ValidateContext(ctx context.Context, files ...*spec.File) error {
	seen := map[string]string{}
	var errs []error
	for _, f := range files {
		var dup error
		if prev, ok := seen[f.VM.Name]; ok {
			dup = f.Errorf("name", "VM %q is also defined in %s", f.VM.Name, prev)
		} else {
			seen[f.VM.Name] = f.Path
		}
		errs = append(errs, s.validateFile(ctx, f, dup))
	}
	return errors.Join(errs...)
}

// validateFile runs the host checks of one file and joins their errors
// with the file's own (f.Join).
func (s *Env) validateFile(ctx context.Context, f *spec.File, dup error) error {
	errs := []error{dup}
	sound := true
	check := func(err error) {
		errs = append(errs, err)
		sound = sound && err == nil
	}
	named := f.Err() == nil || !f.Broken("name") // paths in the state root need the name
	check(f.Err())                               // argv and confinement need the whole spec
	// Paths outside the host's places first: the checks below say nothing
	// more of a refused key, and the storage check does not open a disk
	// with one (qemu-img as root on a host file or device).
	refused, err := s.checkPaths(ctx, f)
	check(err)
	check(places.WithoutFields(checkHost(f, s.hostFacts(), s.opts.QEMU), refused))
	accel, _, cpu, err := s.resolveHost(f)
	check(err)
	if err == nil {
		check(checkPhysBits(f, accel, cpu, s.hostFacts()))
	}
	check(s.Images().Check(f))
	check(s.disks().Check(ctx, f, named, refused))
	check(places.WithoutFields(s.validateNICs(ctx, f), refused))
	if named {
		check(s.checkForwardPorts(f))
	}
	check(s.hostDevs().Check(f))
	if !sound {
		return f.Join(errs...)
	}
	// The argv renders all of the above (vhost, disks, devices), and the
	// confinement looks at the images' chains and the devices' groups.
	_, err = s.Argv(f)
	errs = append(errs, err)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	errs = append(errs, s.Confiner().Check(cctx, f, s.Paths(f.VM.Name), accel))
	cancel()
	return f.Join(errs...)
}

// Argv returns the QEMU command line of the machine vmsup would start for
// f, every disk named by path: what a raw QEMU run of the same machine
// takes. vmsup itself starts QEMU paused without the disks
// DisksByDescriptor lists and plugs those as descriptors (internal/lifecycle/diskfds).
func (s *Env) Argv(f *spec.File) ([]string, error) {
	accel, _, cpu, err := s.resolveHost(f)
	if err != nil {
		return nil, err
	}
	return s.argv(f, accel, cpu)
}

func (s *Env) argv(f *spec.File, accel spec.Accel, cpu CPUChoice, extra ...func(*qemuargs.Options)) ([]string, error) {
	p := s.Paths(f.VM.Name)
	o := qemuargs.Options{
		Binary:         s.opts.QEMU,
		Accel:          accel,
		CPU:            cpu.Model,
		CPUFeaturesOff: cpu.Masks,
		QMPSocket:      p.QMP,
		EventSocket:    p.Events,
		ConsoleSocket:  p.Console,
		AgentSocket:    p.Agent,
		VNCSocket:      p.VNC(),
		ConsoleLog:     companion.FIFO(p, vmstore.UnitName(f.VM.Name)), // its logger bounds the log (internal/lifecycle/companion)
		EventLog:       p.EventLog(),
		VhostNet:       s.Net().Vhost(),
		Disks:          diskprep.HostFiles(p.Dir, &f.VM),
		Credentials:    identity.CredentialPaths(p.Dir, &f.VM),
		TPMSocket:      companion.TPMPaths(p, vmstore.UnitName(f.VM.Name)).Socket,
		ShareSockets:   companion.ShareSockets(p.Dir, &f.VM),
	}
	o.ShareRAM, _ = s.CPRTransfer(context.Background()) // a later migrate --local takes its RAM in place
	switch f.VM.Boot.Firmware {
	case spec.FirmwareUEFI:
		o.FirmwareCode, o.FirmwareVars = caps.BootCode(f.VM.Boot), p.UEFIVars
	case spec.FirmwareQboot:
		o.FirmwareCode = caps.FirmwareCode(spec.FirmwareQboot)
	}
	for _, e := range extra {
		e(&o)
	}
	if o.UUID == "" { // not a start's: the IDs and machine the VM would start with now
		ids := s.recordedIDs(&f.VM)
		o.UUID, o.GenID = ids.UUID, ids.GenID
		var err error
		if o.Machine, err = s.PinMachine(f, f.VM.Machine, s.RecordedMachine(f.VM.Name)); err != nil {
			return nil, err
		}
	}
	if err := s.guestArgv(&f.VM, &o); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	argv, err := qemuargs.Build(&f.VM, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	return argv, nil
}

// DisksByDescriptor names the disks of f that a start gives QEMU as
// descriptors over QMP rather than on its command line.
func (s *Env) DisksByDescriptor(f *spec.File) []string {
	p := s.Paths(f.VM.Name)
	var out []string
	for _, d := range f.VM.Disks {
		if qemuargs.PassedByFD(d, p.Dir) {
			out = append(out, d.Name)
		}
	}
	return out
}

// upParallel bounds how many VMs one Up starts at once: systemd's start
// jobs and QEMU's start-up overlap (100 VMs: 15.3 s one by one, 9.5 s
// concurrently, measured), while a host is not flooded.
const upParallel = 8

// Up brings each VM up: validated all together first (an invalid file
// starts nothing), then started concurrently, each on its own. A VM already
// running with the same spec is left alone; one running with a different
// spec is reported as Changed and not touched. Results are in file order,
// for the VMs that came up; the error joins every VM's failure.
func (s *Env) Up(ctx context.Context, files ...*spec.File) ([]UpResult, error) {
	return s.UpWith(ctx, UpOptions{}, files...)
}

// UpOptions change what UpWith does.
type UpOptions struct {
	// Adopt makes each file the one its VM belongs to where vmsup knows
	// the VM from another file; without it such a file is refused
	// (OwnerError) and nothing is started.
	Adopt bool
}

// UpWith is Up with options.
func (s *Env) UpWith(ctx context.Context, o UpOptions, files ...*spec.File) ([]UpResult, error) {
	if err := s.ValidateContext(ctx, files...); err != nil {
		return nil, err
	}
	var owners []error
	for _, f := range files {
		owners = append(owners, s.CheckOwner(f, o.Adopt))
	}
	if err := errors.Join(owners...); err != nil {
		return nil, err
	}
	res := make([]UpResult, len(files))
	errs := make([]error, len(files))
	sem := make(chan struct{}, upParallel)
	var wg sync.WaitGroup
	for i, f := range files {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			res[i], errs[i] = s.upOne(ctx, f)
			if errs[i] == nil && o.Adopt && res[i].Action != Started {
				errs[i] = s.Adopt(ctx, f)
			}
		}()
	}
	wg.Wait()
	var out []UpResult
	var up []*spec.File
	for i := range files {
		if errs[i] == nil {
			out = append(out, res[i])
			up = append(up, files[i])
		}
	}
	if err := s.enableDeclared(ctx, up); err != nil {
		errs = append(errs, fmt.Errorf("up, but not enabled for boot (autostart = true): %w", err))
	}
	return out, errors.Join(errs...)
}

// upOne brings one VM up through the start pipeline (start.go).
func (s *Env) upOne(ctx context.Context, f *spec.File) (UpResult, error) {
	r := s.newStart(f, StartFresh, IncomingArgs{})
	defer func() {
		if r.lk != nil {
			r.lk.Unlock()
		}
	}()
	if _, err := steps.Run(ctx, r.name, r.steps(), s.opts.AfterStep); err != nil {
		return r.res, err
	}
	if r.res.Action == "" {
		r.res.Action, r.res.State = Started, vmstore.StateRunning
		s.Lifecycle(r.name, eventlog.Started, map[string]any{"generation": r.app.Generation, "accel": r.app.Accel})
	}
	return r.res, nil
}

// How confirmRunning polls: the QMP socket often (a stat is nearly free and
// QEMU is up ~50 ms after exec), the unit's state over D-Bus rarely (even
// its ActiveState alone costs systemd CPU that QEMU's start-up needs on a
// small host; every property of it, as polled before, was ~2 ms of each VM's
// start among 100, measured). Measured by make bench: polling both every
// 20 ms added ~15 ms.
const (
	confirmPoll      = 2 * time.Millisecond
	confirmUnitCheck = 50 * time.Millisecond
)

// confirmRunning waits until QEMU answers QMP and reports "running". If the
// unit fails first, the error carries QEMU's last words from the journal.
//
// resume: QEMU waits paused (-S) for the guest to run, its disks plugged
// by the disks step: "cont" it.
func (s *Env) confirmRunning(ctx context.Context, sd *units.Manager, name string, accel spec.Accel, resume bool) error {
	timeout := ConfirmTimeout(accel)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := s.Paths(name)
	unit := s.state.UnitOf(name)
	// The step before has just seen the start job succeed or the unit
	// active; a QEMU that dies before answering is seen within one check.
	checked := time.Now()
	for {
		if time.Since(checked) >= confirmUnitCheck {
			ended, err := sd.Ended(ctx, unit)
			if err != nil {
				return err
			}
			checked = time.Now()
			if ended {
				st, _ := sd.Status(ctx, unit)
				return fmt.Errorf("QEMU exited (%s): %s", orDefault(st.ExitReason(), orDefault(st.ActiveState, "inactive")), s.LastWords(ctx, unit))
			}
		}
		if _, err := os.Stat(p.QMP); err == nil {
			c, release, err := s.QMPSession(ctx, name)
			if err == nil {
				qs, err := c.QueryStatus(ctx)
				if err == nil && resume && qs.Status == qmp.RunPrelaunch {
					if err = c.Cont(ctx); err == nil {
						qs, err = c.QueryStatus(ctx)
					}
				}
				release()
				if err == nil && qs.Running {
					return nil
				}
				if err == nil {
					return fmt.Errorf("QEMU is %q, not running", qs.Status)
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("QEMU did not answer on QMP within %s: %s", timeout, s.LastWords(context.Background(), unit))
		case <-time.After(confirmPoll):
		}
	}
}

// reportExisting fills res for a VM that up found existing (its unit
// active): the state QEMU reports and what to do about it. It never changes
// the VM. A QEMU that has not answered yet (a previous up died before
// confirming it) is waited for, up to confirmTimeout of its accelerator.
func (s *Env) reportExisting(ctx context.Context, sd *units.Manager, name, unit string, res *UpResult) error {
	timeout := ConfirmTimeout(res.Accel)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		c, release, err := s.QMPSession(ctx, name)
		if err == nil {
			var qs qmp.StatusInfo
			qs, err = c.QueryStatus(ctx)
			release()
			if err == nil {
				res.State, res.Note = existingState(name, qs.Status, res.Note)
				return nil
			}
		}
		st, serr := sd.Status(ctx, unit)
		if serr == nil && st.Gone() {
			return fmt.Errorf("QEMU exited while up looked at it (%s); run up again", orDefault(st.ExitReason(), st.ActiveState))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("unit %s is active but QEMU does not answer on QMP within %s (%v); left as it is: see vmsup status %s",
				unit, timeout, err, name)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// existingState maps QEMU's run state of a VM up left alone to vmsup's
// state and a note saying what to do, appended to note.
func existingState(name string, qemuStatus qmp.RunState, note string) (vmstore.State, string) {
	add := func(n string) string {
		if note == "" {
			return n
		}
		return note + "; " + n
	}
	switch qemuStatus {
	case qmp.RunRunning:
		return vmstore.StateRunning, note
	case qmp.RunPaused:
		return vmstore.StatePaused, add("paused: vmsup resume " + name)
	case qmp.RunSuspended:
		return vmstore.StatePaused, add("suspended by the guest (ACPI S3): QMP system_wakeup wakes it")
	case qmp.RunPostMigrate:
		return vmstore.StatePaused, add("postmigrate: a migration of it completed and the guest may run elsewhere; " +
			"check the destination before vmsup resume " + name)
	case qmp.RunInMigrate:
		return vmstore.State(qemuStatus), add("inmigrate: waiting for an incoming migration")
	case qmp.RunPrelaunch:
		return vmstore.StatePaused, add("prelaunch: QEMU has not started the guest yet: vmsup resume " + name)
	}
	return vmstore.State(strings.ReplaceAll(string(qemuStatus), "-", " ")), add(string(qemuStatus) + ": left as it is (vmsup status " + name + ")")
}

// LastWords returns the last error line QEMU wrote to the unit's journal.
func (s *Env) LastWords(ctx context.Context, unit string) string {
	return units.LastWords(ctx, s.opts.JournalDir, unit)
}

// RunsFile reports whether the VM recorded in app runs vm as it is (after
// live changes, with keys newer than the record at their defaults).
func RunsFile(app *vmstore.Applied, vm *spec.VM) bool {
	running, err := app.Running()
	if err != nil {
		return false
	}
	running = vmstore.AsMoved(running, app.Moved, vm)
	identity.KeepUUID(running, vm, app.UUID)
	return bytes.Equal(vmstore.Canonical(running), vmstore.Canonical(vm))
}

func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
