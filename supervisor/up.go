package supervisor

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

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
	State State
}

// Validate checks files as Up would, without starting anything: each parses,
// names are unique across files, and what they refer to exists on this host.
func (s *Supervisor) Validate(files ...*spec.File) error {
	seen := map[string]string{}
	for _, f := range files {
		if prev, dup := seen[f.VM.Name]; dup {
			return f.Errorf("name", "VM %q is also defined in %s", f.VM.Name, prev)
		}
		seen[f.VM.Name] = f.Path
		if err := checkHost(f, s.hostFacts(), s.opts.QEMU); err != nil {
			return err
		}
		if _, _, _, err := s.resolveHost(f); err != nil {
			return err
		}
		if err := s.checkStorage(context.Background(), f); err != nil {
			return err
		}
		if _, err := s.Argv(f); err != nil {
			return err
		}
		if err := s.validateNICs(f); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := s.checkSecurity(ctx, f)
		cancel()
		if err != nil {
			return err
		}
	}
	return nil
}

// Argv returns the exact QEMU command line vmsup would run for f.
func (s *Supervisor) Argv(f *spec.File) ([]string, error) {
	accel, _, cpu, err := s.resolveHost(f)
	if err != nil {
		return nil, err
	}
	return s.argv(f, accel, cpu)
}

func (s *Supervisor) argv(f *spec.File, accel spec.Accel, cpu cpuChoice, extra ...func(*qemuargs.Options)) ([]string, error) {
	p := s.paths(f.VM.Name)
	o := qemuargs.Options{
		Binary:         s.opts.QEMU,
		Accel:          accel,
		CPU:            cpu.Model,
		CPUFeaturesOff: cpu.Masks,
		QMPSocket:      p.QMP,
		EventSocket:    p.Events,
		ConsoleSocket:  p.Console,
		AgentSocket:    p.Agent,
		ConsoleLog:     p.ConsoleLog,
		VhostNet:       s.vhostNet(),
		Disks:          diskHosts(p, &f.VM),
	}
	switch f.VM.Boot.Firmware {
	case spec.FirmwareUEFI:
		o.FirmwareCode, o.FirmwareVars = firstExisting(ovmfCode), p.UEFIVars
	case spec.FirmwareQboot:
		o.FirmwareCode = firstExisting(qbootROM)
	}
	for _, e := range extra {
		e(&o)
	}
	argv, err := qemuargs.Build(&f.VM, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	return argv, nil
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
func (s *Supervisor) Up(ctx context.Context, files ...*spec.File) ([]UpResult, error) {
	if err := s.Validate(files...); err != nil {
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

func (s *Supervisor) upOne(ctx context.Context, f *spec.File) (UpResult, error) {
	name := f.VM.Name
	res := UpResult{VM: name}
	unit := s.unitOf(name) // after a local migration, not vmsup-NAME.service
	p := s.paths(name)
	var (
		sd      *units.Manager
		lk      *vmLock
		argv    []string
		prevDir bool
		prevApp []byte
		prevRaw []byte
		app     = &applied{Name: name, SourceFile: absPath(f.Path), Spec: canonical(&f.VM)}
		plan    = &startPlan{}
	)
	steps := []step{
		{name: "validate", do: func(ctx context.Context) (err error) {
			var cpu cpuChoice
			app.Accel, app.AccelReason, cpu, err = s.resolveHost(f)
			app.CPUModel, app.CPUMasks = cmp.Or(f.VM.CPUModel, cpu.Model), cpu.Masks
			res.Accel, res.AccelReason = app.Accel, app.AccelReason
			if err != nil {
				return err
			}
			sd, err = s.systemd(ctx)
			return err
		}},
		{name: "lock", do: func(ctx context.Context) (err error) {
			lk, err = s.lock(ctx, name, "up")
			return err
		}, undo: func(context.Context) { lk.unlock() }},
		{name: "check", do: func(ctx context.Context) error {
			st, err := sd.Status(ctx, unit)
			if err != nil {
				return err
			}
			if !st.Exists || st.ActiveState == "inactive" || st.ActiveState == "failed" {
				defer func() { unit = units.Name(name) }() // a fresh start uses the usual name
			}
			switch {
			case st.Exists && st.ActiveState == "failed":
				res.Note = "previous run crashed: " + st.ExitReason()
				return sd.ResetFailed(ctx, unit)
			case st.Exists && st.ActiveState != "inactive":
				if st.ActiveState != "active" {
					return fmt.Errorf("unit %s is %s; try again when it settles", unit, st.ActiveState)
				}
				old, err := s.readApplied(name)
				res.Action = Changed
				if err == nil && sameJSON(old.Spec, app.Spec) {
					res.Action = Unchanged
				}
				if err == nil {
					res.Accel, res.AccelReason = old.Accel, old.AccelReason
				}
				// The VM exists: report it as it is, whatever its state,
				// and touch nothing (no later step, no undo).
				if err := s.reportExisting(ctx, sd, name, unit, &res); err != nil {
					return err
				}
				return errStopHere
			}
			return nil
		}},
		{name: "state-dir", do: func(ctx context.Context) error {
			var err error
			if plan.carried, err = s.carriedDisks(f); err != nil {
				return err
			}
			_, err = os.Stat(p.Dir)
			prevDir = err == nil
			prevApp, _ = os.ReadFile(p.State)
			prevRaw, _ = os.ReadFile(p.Spec)
			if err := os.MkdirAll(p.Dir, 0o700); err != nil {
				return err
			}
			if err := os.Chmod(p.Dir, 0o700); err != nil {
				return err
			}
			if err := p.removeSockets(); err != nil {
				return err
			}
			if f.VM.Boot.Firmware == spec.FirmwareUEFI {
				if _, err := os.Stat(p.UEFIVars); errors.Is(err, os.ErrNotExist) {
					if err := copyFile(firstExisting(ovmfVars), p.UEFIVars); err != nil {
						return fmt.Errorf("UEFI variable store: %w", err)
					}
				}
			}
			return nil
		}, undo: func(context.Context) {
			if !prevDir {
				p.removeAll()
			}
		}},
	}
	// What QEMU needs on the host (disks, NICs, confinement), each concern's
	// steps with their undo.
	steps = append(steps, s.hostSteps(f, p, plan)...)
	steps = append(steps, []step{
		{name: "argv", do: func(ctx context.Context) (err error) {
			boot := bootFile(f, plan.carried)
			argv, err = s.argv(boot, app.Accel, cpuChoice{app.CPUModel, app.CPUMasks}, plan.argvOpts...)
			app.Argv = argv
			app.recordBootDisks(&boot.VM, plan.carried)
			return err
		}},
		{name: "record", do: func(ctx context.Context) error {
			app.StartedAt = time.Now().UTC()
			return s.writeApplied(app, f.Raw)
		}, undo: func(context.Context) {
			if prevDir {
				restoreFile(p.State, prevApp)
				restoreFile(p.Spec, prevRaw)
			}
		}},
		{name: "unit", do: func(ctx context.Context) error {
			u := s.unitFor(f, argv, app.Accel)
			for _, o := range plan.unitOpts {
				o(&u)
			}
			if err := sd.Start(ctx, u); err != nil {
				// A QEMU that refuses at once can fail the start job
				// itself: say why, as confirm would.
				return fmt.Errorf("%w: %s", err, s.lastWords(ctx, u.Name))
			}
			return nil
		}, undo: func(ctx context.Context) {
			_ = sd.Kill(ctx, unit, 9)
			waitGone(ctx, sd, unit)
			_ = sd.ResetFailed(ctx, unit)
		}},
		{name: "confirm", do: func(ctx context.Context) error {
			return s.confirmRunning(ctx, sd, name)
		}},
	}...)
	defer func() {
		if lk != nil {
			lk.unlock()
		}
	}()
	if err := runSteps(ctx, name, steps, s.opts.AfterStep); err != nil {
		lk = nil // unlocked by the undo
		return res, err
	}
	if res.Action == "" {
		res.Action, res.State = Started, StateRunning
	}
	return res, nil
}

// How confirmRunning polls: the QMP socket often (a stat is nearly free and
// QEMU is up ~50 ms after exec), the unit's state over D-Bus rarely (each
// GetAllProperties costs systemd ~1-3 ms of CPU that QEMU's start-up needs on
// a small host). Measured by make bench: polling both every 20 ms added ~15 ms.
const (
	confirmPoll      = 2 * time.Millisecond
	confirmUnitCheck = 50 * time.Millisecond
)

// confirmRunning waits until QEMU answers QMP and reports "running". If the
// unit fails first, the error carries QEMU's last words from the journal.
func (s *Supervisor) confirmRunning(ctx context.Context, sd *units.Manager, name string) error {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	p := s.paths(name)
	unit := s.unitOf(name)
	// The step before has just seen the start job succeed or the unit
	// active; a QEMU that dies before answering is seen within one check.
	checked := time.Now()
	for {
		if time.Since(checked) >= confirmUnitCheck {
			st, err := sd.Status(ctx, unit)
			if err != nil {
				return err
			}
			checked = time.Now()
			if !st.Exists || st.ActiveState == "failed" || st.ActiveState == "inactive" {
				return fmt.Errorf("QEMU exited (%s): %s", orDefault(st.ExitReason(), st.ActiveState), s.lastWords(ctx, unit))
			}
		}
		if _, err := os.Stat(p.QMP); err == nil {
			c, release, err := s.qmpSession(ctx, name)
			if err == nil {
				qs, err := c.QueryStatus(ctx)
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
			return fmt.Errorf("QEMU did not answer on QMP within %s: %s", confirmTimeout, s.lastWords(context.Background(), unit))
		case <-time.After(confirmPoll):
		}
	}
}

// reportExisting fills res for a VM that up found existing (its unit
// active): the state QEMU reports and what to do about it. It never changes
// the VM. A QEMU that has not answered yet (a previous up died before
// confirming it) is waited for, up to confirmTimeout.
func (s *Supervisor) reportExisting(ctx context.Context, sd *units.Manager, name, unit string, res *UpResult) error {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	for {
		c, release, err := s.qmpSession(ctx, name)
		if err == nil {
			var qs qmp.StatusInfo
			qs, err = c.QueryStatus(ctx)
			if err == nil && !qs.Running {
				// A source a dead migration left paused runs again.
				if resumed, rerr := s.recoverStoppedSource(ctx, name, c, true); rerr == nil && resumed {
					qs, err = c.QueryStatus(ctx)
				}
			}
			release()
			if err == nil {
				res.State, res.Note = existingState(name, qs.Status, res.Note)
				return nil
			}
		}
		st, serr := sd.Status(ctx, unit)
		if serr == nil && (!st.Exists || st.ActiveState == "failed" || st.ActiveState == "inactive") {
			return fmt.Errorf("QEMU exited while up looked at it (%s); run up again", orDefault(st.ExitReason(), st.ActiveState))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("unit %s is active but QEMU does not answer on QMP within %s (%v); left as it is: see vmsup status %s",
				unit, confirmTimeout, err, name)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// existingState maps QEMU's run state of a VM up left alone to vmsup's
// state and a note saying what to do, appended to note.
func existingState(name, qemuStatus, note string) (State, string) {
	add := func(n string) string {
		if note == "" {
			return n
		}
		return note + "; " + n
	}
	switch qemuStatus {
	case "running":
		return StateRunning, note
	case "paused":
		return StatePaused, add("paused: vmsup resume " + name)
	case "suspended":
		return StatePaused, add("suspended by the guest (ACPI S3): QMP system_wakeup wakes it")
	case "postmigrate":
		return StatePaused, add("postmigrate: a migration of it completed and the guest may run elsewhere; " +
			"check the destination before vmsup resume " + name)
	case "inmigrate":
		return State(qemuStatus), add("inmigrate: waiting for an incoming migration")
	case "prelaunch":
		return StatePaused, add("prelaunch: QEMU has not started the guest yet: vmsup resume " + name)
	}
	return State(strings.ReplaceAll(qemuStatus, "-", " ")), add(qemuStatus + ": left as it is (vmsup status " + name + ")")
}

// lastWords returns the last error line QEMU wrote to the unit's journal.
func (s *Supervisor) lastWords(ctx context.Context, unit string) string {
	args := []string{"-u", unit, "-o", "cat", "--no-pager", "-n", "20"}
	if s.opts.JournalDir != "" {
		args = append([]string{"-D", s.opts.JournalDir}, args...)
	}
	hint := "see journalctl -u " + unit
	var last string
	// journald may not have the lines yet when the unit has already failed.
	for range 10 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		out, err := exec.CommandContext(cctx, "journalctl", args...).Output()
		cancel()
		if err != nil {
			return hint
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// QEMU prefixes its errors with its name: "qemu-system-x86_64:"
			// from most of it, "qemu:" from the loaders.
			if strings.Contains(l, "qemu-system") || strings.HasPrefix(l, "qemu:") {
				last = l
			}
		}
		if last != "" {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
	return hint
}

func sameJSON(a, b []byte) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
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

func waitGone(ctx context.Context, sd *units.Manager, unit string) {
	for ctx.Err() == nil {
		st, err := sd.Status(ctx, unit)
		if err != nil || !st.Exists || st.ActiveState == "inactive" || st.ActiveState == "failed" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}

func restoreFile(path string, old []byte) {
	if old == nil {
		os.Remove(path)
		return
	}
	_ = os.WriteFile(path, old, 0o600)
}
