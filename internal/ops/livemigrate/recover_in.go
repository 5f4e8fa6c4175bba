package livemigrate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
)

// The destination of a migration from another host whose receiver died:
// the guest runs here if its QEMU was started (then it is recorded); else
// all of it is torn down and the source keeps the guest.

// incomingIntent is a migration destination's journal (another host).
type incomingIntent struct {
	Unit      string            `json:"unit"`
	Existed   bool              `json:"existed"` // the VM had a state directory here before
	Autostart bool              `json:"autostart,omitempty"`
	App       *vmstore.Applied  `json:"app,omitempty"` // what commit records
	Raw       []byte            `json:"raw,omitempty"`
	Copies    []string          `json:"copies,omitempty"` // disk images made here for a copy (storage_in.go)
	Markers   map[string]string `json:"-"`
}

// inAction is what recovery does with a migration's destination, or the
// look it takes first.
type inAction uint8

const (
	inLookUnit inAction = iota + 1 // look: the incoming QEMU's unit
	inLookRun                      // look: the incoming QEMU's run state
	inRecorded                     // the guest runs here and was recorded (the incoming directory goes last)
	inAdopt                        // the incoming QEMU runs the guest (cont was sent): the hand-over is finished, recorded
	inTearDown                     // it does not: torn down, the source keeps the guest
)

// note is what recovery says it did (the CLI shows it).
func (a inAction) note() string {
	switch a {
	case inRecorded:
		return "the guest runs here: the migration had been recorded"
	case inAdopt:
		return "the guest runs here: the hand-over is finished and recorded"
	case inTearDown:
		return "the incoming QEMU had not taken over: it is torn down"
	}
	return ""
}

// inSeen is what recovery sees of a migration's destination.
type inSeen struct {
	unitLooked, unitGone bool // systemd: the incoming QEMU's unit ended
	inDir                bool // its incoming directory is there
	app                  bool // the journal has what commit records (from the record step)
	run                  qmp.RunState
	runLooked            bool
}

// decideIn is what recovery does with a migration's destination.
func decideIn(s inSeen) inAction {
	switch {
	case !s.unitLooked:
		return inLookUnit
	case !s.unitGone && !s.inDir:
		return inRecorded
	case !s.unitGone && !s.runLooked:
		return inLookRun
	case s.run == qmp.RunRunning && s.app:
		return inAdopt
	}
	return inTearDown
}

// seeIn looks until decideIn decides: u and q are systemd and the
// incoming QEMU's monitor (of unit, at the socket sock names).
func seeIn(ctx context.Context, u unitStates, q qemuStates, unit string, sock func() string, s inSeen) (inAction, inSeen, error) {
	for {
		switch a := decideIn(s); a {
		case inLookUnit:
			st, err := u.Status(ctx, unit)
			if err != nil {
				return a, s, err
			}
			s.unitLooked, s.unitGone = true, st.Gone()
		case inLookRun:
			run, err := destState(ctx, u, q, unit, sock)
			if err != nil {
				return a, s, err
			}
			s.run, s.runLooked = run, true
		default:
			return a, s, nil
		}
	}
}

// recoverMigrateIn settles a destination whose receiver died (decideIn).
func (mg *Migrator) recoverMigrateIn(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[incomingIntent](op)
	if err != nil {
		return "", err
	}
	a, err := mg.settleIn(ctx, name, in)
	if err != nil {
		return "", err
	}
	return a.note(), nil
}

// settleIn settles a destination whose receiver died and says what it did.
func (mg *Migrator) settleIn(ctx context.Context, name string, in incomingIntent) (inAction, error) {
	sd, err := mg.env.Systemd(ctx)
	if err != nil {
		return 0, err
	}
	p := mg.paths(name)
	inDir := incomingDir(p)
	// The hand-over renames qmp.sock first: once it is gone from the
	// incoming directory, the VM's usual name reaches this QEMU.
	sock := func() string {
		if q := filepath.Join(inDir, "qmp.sock"); exists(q) || !exists(p.QMP) {
			return q
		}
		return p.QMP
	}
	a, _, err := seeIn(ctx, sd, mg.env, in.Unit, sock, inSeen{inDir: inDir != "", app: in.App != nil})
	if err != nil {
		return 0, err
	}
	switch a {
	case inRecorded:
		if in.Autostart {
			_ = mg.enableApplied(ctx, name)
		}
	case inAdopt:
		if err := handOver(inDir, p.Dir, nil); err != nil {
			return 0, err
		}
		in.App.StartedAt = time.Now().UTC()
		if err := mg.env.State().WriteApplied(in.App, in.Raw); err != nil {
			return 0, fmt.Errorf("record: %w", err)
		}
		os.RemoveAll(inDir)
		if in.Autostart {
			_ = mg.enableApplied(ctx, name)
		}
	case inTearDown:
		mg.env.RemoveUnit(ctx, sd, in.Unit)
		if err := mg.env.AfterStop(ctx, name); err != nil {
			return 0, err
		}
		if inDir != "" {
			os.RemoveAll(inDir)
		}
		if !in.Existed {
			if err := p.RemoveAll(); err != nil {
				return 0, err
			}
		}
	}
	return a, nil
}

// takeForwards gives the VM's QEMU, new after a local migration, its user
// NICs' host forwards (forwards.go); the note says what could not be added.
func (mg *Migrator) takeForwards(ctx context.Context, name string) string {
	v, err := mg.env.View(name)
	if err != nil {
		return "forwards: " + err.Error()
	}
	vm := v.Booted
	c, release, err := mg.env.QMPSession(ctx, name)
	if err != nil {
		return "forwards: " + err.Error()
	}
	defer release()
	note, _ := addForwards(ctx, c, vm, true)
	return note
}

// The autostart side of a migration: the source drops its mark (a reboot
// there must not start a second copy) and the destination marks the VM's
// applied spec (enableApplied).
func (mg *Migrator) enableApplied(ctx context.Context, name string) error {
	if _, err := mg.env.State().Mark(name, mg.paths(name).Spec); err != nil {
		return err
	}
	return mg.env.AutostartMarks().SyncBootUnit(ctx)
}
