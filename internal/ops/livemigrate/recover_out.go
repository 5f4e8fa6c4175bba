package livemigrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// The source side of a migration whose vmsup died, on one host (the new
// QEMU keeps the guest if it runs it, else the source does) or to another
// (the source resumes unless the destination may run the guest; then this
// host's copy goes).

// localAction is what recovery does after a migration on one host, or
// the look it takes first.
type localAction uint8

const (
	localLookDestUnit localAction = iota + 1 // look: the new QEMU's unit
	localLookDest                            // look: the new QEMU's run state (waiting for one starting or ending)
	localRecorded                            // the record has the new QEMU: only the incoming directory may be left
	localHandOver                            // the new QEMU runs the guest: the source's quits, the new one takes the VM's names
	localAdopt                               // the new QEMU runs the guest, the source's is gone: it takes the VM's names
	localAdoptPaused                         // the new QEMU has the guest paused, the source's is gone: resumed, it takes the names
	localKeepSource                          // the new QEMU does not run the guest, the source's does: the new one is removed
	localLost                                // neither QEMU runs it: the new one is removed, the error says so
)

var errLocalLost = errors.New("neither QEMU runs the guest any more (the source's is gone, the new one had not received it all)")

// note is what recovery says it did (the CLI shows it; a taken-over VM's
// forwards add theirs).
func (a localAction) note() string {
	switch a {
	case localRecorded:
		return "the new QEMU had taken over and was recorded"
	case localHandOver, localAdopt, localAdoptPaused:
		return "the new QEMU runs the guest: the hand-over is finished"
	case localKeepSource:
		return "the guest runs on in the source QEMU; the new QEMU was removed"
	}
	return ""
}

// localSeen is what recovery sees of a migration on one host.
type localSeen struct {
	// The unit the record names ("" for the usual one), the new QEMU's,
	// and the usual unit of the VM.
	recordUnit, destUnit, usualUnit string
	srcGone                         bool // systemd: the source's unit ended
	inDir                           bool // the new QEMU's incoming directory is there
	destLooked, destGone            bool // systemd: the new QEMU's unit ended
	// The new QEMU's run state ("" when its unit ended while asked).
	run       qmp.RunState
	runLooked bool
}

// decideLocal is what recovery does after a migration on one host.
func decideLocal(s localSeen) localAction {
	switch {
	case s.recordUnit == s.destUnit || s.destUnit == s.usualUnit && s.recordUnit == "" && s.srcGone:
		return localRecorded
	case !s.destLooked:
		return localLookDestUnit
	case !s.destGone && s.inDir && !s.runLooked:
		return localLookDest
	case s.run == qmp.RunRunning && !s.srcGone:
		return localHandOver
	case s.run == qmp.RunRunning:
		return localAdopt
	case s.run == qmp.RunPaused && s.srcGone:
		return localAdoptPaused
	case !s.srcGone:
		return localKeepSource
	}
	return localLost
}

// seeLocal looks until decideLocal decides: u and q are systemd and the
// new QEMU's monitor, at the socket sock names.
func seeLocal(ctx context.Context, u unitStates, q qemuStates, sock func() string, s localSeen) (localAction, localSeen, error) {
	for {
		switch a := decideLocal(s); a {
		case localLookDestUnit:
			st, err := u.Status(ctx, s.destUnit)
			if err != nil {
				return a, s, err
			}
			s.destLooked, s.destGone = true, st.Gone()
		case localLookDest:
			run, err := destState(ctx, u, q, s.destUnit, sock)
			if err != nil {
				return a, s, err
			}
			s.run, s.runLooked = run, true
		default:
			return a, s, nil
		}
	}
}

// settleLocal settles a migration on one host (decideLocal).
func (mg *Migrator) settleLocal(ctx context.Context, name string, in migrateIntent, sd *units.Manager, src units.Status) (string, error) {
	p := mg.paths(name)
	app, err := mg.env.State().ReadApplied(name)
	if err != nil {
		return "", err
	}
	inDir := incomingDir(p)
	// The hand-over renames qmp.sock first, and only once the source's
	// QEMU is gone (before, the usual name is the source's).
	sock := func() string {
		if q := filepath.Join(inDir, "qmp.sock"); exists(q) || !src.Gone() {
			return q
		}
		return p.QMP
	}
	a, _, err := seeLocal(ctx, sd, mg.env, sock, localSeen{recordUnit: app.Unit, destUnit: in.DestUnit, usualUnit: vmstore.UnitName(name),
		srcGone: src.Gone(), inDir: inDir != ""})
	if err != nil {
		return "", err
	}
	switch a {
	case localRecorded:
		mg.endMove(name, true) // killed before the taps' hand-over finished
		if inDir != "" {
			os.RemoveAll(inDir) // killed between the record and this
		}
		return a.note(), nil
	case localHandOver, localAdopt, localAdoptPaused:
		if a == localHandOver {
			if err := mg.quitSource(ctx, sd, name, in.Unit, true); err != nil {
				return "", err
			}
		}
		if a == localAdoptPaused {
			if err := mg.contAt(ctx, filepath.Join(inDir, "qmp.sock")); err != nil {
				return "", err
			}
		}
		if err := mg.commitLocal(name, app, in.DestUnit, inDir); err != nil {
			return "", err
		}
		note := a.note()
		if fw := mg.takeForwards(ctx, name); fw != "" {
			note += "; " + fw
		}
		return note, nil
	case localKeepSource:
		mg.env.RemoveUnit(ctx, sd, in.DestUnit)
		mg.endMove(name, false)
		if inDir != "" {
			os.RemoveAll(inDir)
		}
		if err := mg.resumeHere(ctx, name); err != nil {
			return "", err
		}
		return a.note(), nil
	}
	mg.env.RemoveUnit(ctx, sd, in.DestUnit)
	return "", errLocalLost
}

// remoteAction is what recovery does after a migration to another host,
// or the look it takes first.
type remoteAction uint8

const (
	remoteLookSource  remoteAction = iota + 1 // look: the source QEMU's run state
	remoteAskDest                             // look: ask the destination's vmsup whether the guest runs there
	remoteReadLocks                           // look: whether another QEMU holds the shared disks' write locks
	remoteDropRecords                         // the source's QEMU is gone, the guest runs on the destination: this host's records go
	remoteSourceEnded                         // the source's QEMU is gone, and the destination is not known to run the guest
	remoteQuitSource                          // the destination runs the guest: the source's QEMU quits, this host's copy goes
	remoteSourceRuns                          // the source runs the guest: nothing (the destination tears down when its transport closes)
	remoteResume                              // the destination does not run the guest: the source's resumes
	remoteStuck                               // the destination may run it, and nothing can say: the source stays paused
)

// note is what recovery says it did (the CLI shows it).
func (a remoteAction) note(to string) string {
	switch a {
	case remoteDropRecords:
		return fmt.Sprintf("the guest runs on %s: this host's records are removed", to)
	case remoteSourceEnded:
		return "the source's QEMU ended during the migration"
	case remoteQuitSource:
		return fmt.Sprintf("the guest runs on %s: this host's copy is removed", to)
	case remoteSourceRuns:
		return "the guest runs on the source; the destination tears its QEMU down when its transport closes"
	case remoteResume:
		return "the destination does not run the guest: it runs on the source again"
	}
	return ""
}

// errStuck is remoteStuck's error for a migration to host to.
func errStuck(to string) error {
	return fmt.Errorf("the destination %s may run the guest and cannot be asked (its transport fails) nor told by the disks' locks: "+
		"the source stays paused; check %s, then vmsup resume here or vmsup down here", to, to)
}

// remoteSeen is what recovery sees of a migration to another host.
type remoteSeen struct {
	srcGone                             bool // systemd: the source's unit ended
	finalizeSent, finalized, sourceQuit bool // journaled
	run                                 qmp.RunState
	runLooked                           bool
	dest                                answer // the destination's vmsup: the guest runs there
	locks                               answer // another QEMU holds the shared disks' write locks
}

// decideRemote is what recovery does after a migration to another host.
// Once finalize was sent the destination may run the guest: the source
// resumes only if the destination (or the disks' locks) says it does not.
func decideRemote(s remoteSeen) remoteAction {
	if s.srcGone {
		switch {
		case s.sourceQuit || s.finalized:
			return remoteDropRecords
		case s.finalizeSent && s.dest == notAsked:
			return remoteAskDest
		case s.finalizeSent && s.dest == answerYes:
			return remoteDropRecords
		}
		return remoteSourceEnded
	}
	switch {
	case s.finalized:
		// The source's QEMU may be quitting already (its command sent
		// quit, then died): its monitor goes before its unit does, so it
		// is not asked anything.
		return remoteQuitSource
	case !s.runLooked:
		return remoteLookSource
	case s.run == qmp.RunRunning:
		return remoteSourceRuns
	case !s.finalizeSent:
		return remoteResume
	case s.dest == notAsked:
		return remoteAskDest
	case s.dest == answerYes:
		return remoteQuitSource
	case s.dest == answerNo:
		return remoteResume
	case s.locks == notAsked: // the destination cannot be asked
		return remoteReadLocks
	case s.locks == answerYes:
		return remoteQuitSource
	case s.locks == answerNo:
		return remoteResume
	}
	return remoteStuck
}

// seeRemote looks until decideRemote decides.
func seeRemote(ctx context.Context, look elsewhere, name string, in migrateIntent, s remoteSeen) (remoteAction, remoteSeen, error) {
	for {
		switch a := decideRemote(s); a {
		case remoteLookSource:
			run, err := look.sourceState(ctx, name)
			if err != nil {
				return a, s, err
			}
			s.run, s.runLooked = run, true
		case remoteAskDest:
			s.dest = answerOf(look.askDestination(ctx, name, in))
		case remoteReadLocks:
			s.locks = answerOf(look.lockedElsewhere(name, in.Copies))
		default:
			return a, s, nil
		}
	}
}

// settleRemote settles a migration to another host (decideRemote).
func (mg *Migrator) settleRemote(ctx context.Context, name string, in migrateIntent, op *operation.Op, sd *units.Manager, src units.Status) (string, error) {
	a, _, err := seeRemote(ctx, mg, name, in, remoteSeen{srcGone: src.Gone(),
		finalizeSent: op.Has(stepMigFinalizeSent), finalized: op.Has(stepMigFinalized), sourceQuit: op.Has(stepMigSourceQuit)})
	if err != nil {
		return "", err
	}
	switch a {
	case remoteQuitSource:
		if err := mg.quitSource(ctx, sd, name, in.Unit, false); err != nil {
			return "", err
		}
		fallthrough
	case remoteDropRecords:
		mg.dropMigrated(ctx, name, in)
	case remoteResume:
		if err := mg.resumeHere(ctx, name); err != nil {
			return "", err
		}
	case remoteStuck:
		return "", errStuck(in.To)
	}
	return a.note(in.To), nil
}

// sourceState is the source QEMU's run state, asked at its monitor.
func (mg *Migrator) sourceState(ctx context.Context, name string) (qmp.RunState, error) {
	c, release, err := mg.env.QMPSession(ctx, name)
	if err != nil {
		return "", err
	}
	qs, err := c.QueryStatus(ctx)
	release()
	return qs.Status, err
}

// commitLocal gives the new QEMU the VM's socket names and records it.
func (mg *Migrator) commitLocal(name string, app *vmstore.Applied, unit, inDir string) error {
	p := mg.paths(name)
	mg.endMove(name, true)
	if err := handOver(inDir, p.Dir, nil); err != nil {
		return err
	}
	app.Unit, app.MigratedFrom, app.StartedAt = "", "local", time.Now().UTC()
	if unit != vmstore.UnitName(name) {
		app.Unit = unit
	}
	raw, err := os.ReadFile(p.Spec)
	if err != nil {
		return err
	}
	if err := mg.env.State().WriteApplied(app, raw); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	os.RemoveAll(inDir)
	return nil
}

// endMove ends a local migration's taps (startplan.EndMove): a failure leaves
// both recorded, which the VM's next stop removes, and a warning.
func (mg *Migrator) endMove(name string, moved bool) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	if err := mg.endMoveTaps(ctx, name, moved); err != nil {
		mg.log.Warn("local migration: the taps' hand-over", "vm", name, "moved", moved, "err", err)
	}
}

// dropMigrated removes what is left here of a VM that now runs elsewhere.
func (mg *Migrator) dropMigrated(ctx context.Context, name string, in migrateIntent) {
	if err := mg.env.AfterStop(ctx, name); err != nil {
		mg.log.Warn("clean-up after migration", "vm", name, "err", err)
	}
	if err := mg.paths(name).RemoveAll(); err != nil {
		mg.log.Warn("remove state after migration", "vm", name, "err", err)
	}
	if in.Autostart {
		_ = mg.env.State().Unmark(name)
		_ = mg.env.AutostartMarks().SyncBootUnit(ctx)
	}
}

// quitSource ends the source's QEMU (quit, then kill). handover: its
// stop-post hook must leave the network and grants to the new QEMU.
func (mg *Migrator) quitSource(ctx context.Context, sd *units.Manager, name, unit string, handover bool) error {
	p := mg.paths(name)
	if handover {
		if err := os.WriteFile(p.Handover(), nil, 0o600); err != nil {
			return err
		}
		defer os.Remove(p.Handover())
	}
	qctx, cancel := context.WithTimeout(ctx, killTimeout)
	defer cancel()
	if c, release, err := mg.env.QMPSession(qctx, name); err == nil {
		_ = c.Quit(qctx)
		release()
	}
	if err := sd.WaitStopped(qctx, unit); err != nil {
		sd.KillAndWait(qctx, unit)
		return sd.WaitStopped(qctx, unit)
	}
	return nil
}

// resumeHere makes the source's guest run (after a failed or abandoned
// migration QEMU resumes it itself, except after a stop-and-copy or a
// completed stream).
func (mg *Migrator) resumeHere(ctx context.Context, name string) error {
	c, release, err := mg.env.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if info, err := c.QueryMigrate(ctx); err == nil && (info.Status == qmp.MigrationActive || info.Status == qmp.MigrationSetup ||
		info.Status == qmp.MigrationPreSwitchover || info.Status == qmp.MigrationDevice) {
		// Its vmsup is gone: nobody would finalize it (a cpr-transfer's
		// source waits in setup for a destination that will not listen; a
		// storage migration's, paused before the switch-over, for its
		// copies to end).
		_ = c.MigrateCancel(ctx)
	}
	return migwire.ResumeSource(c)
}

func (mg *Migrator) contAt(ctx context.Context, sock string) error {
	dctx, cancel := context.WithTimeout(ctx, qmpConnectTimeout)
	defer cancel()
	c, err := qmp.Dial(dctx, sock, qmp.WithoutSymlink(), qmp.WithLogger(mg.log))
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Cont(dctx)
}
