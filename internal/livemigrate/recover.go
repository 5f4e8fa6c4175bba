package livemigrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/vmsup/vmsup/internal/migration"
	"github.com/vmsup/vmsup/internal/operation"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// Settling a migration whose vmsup died: exactly one QEMU may run the
// guest afterwards. Which one is read from the QEMUs themselves (their run
// state), systemd (their units), and, across hosts, the destination's own
// answer (a query over the same transport) or, failing that, the write
// locks on the shared disks.

// Steps of the source side of a migration, as journaled and as AfterStep
// sees them.
const (
	stepMigPrepared     operation.Step = "migrate-prepared"      // the destination QEMU waits for the stream
	stepMigCompleted    operation.Step = "migrate-completed"     // the stream completed
	stepMigFinalizeSent operation.Step = "migrate-finalize-sent" // from here the destination may run the guest
	stepMigFinalized    operation.Step = "migrate-finalized"     // the destination runs the guest
	stepMigQuitSent     operation.Step = "migrate-quit-sent"     // the source's QEMU was told to quit
	stepMigSourceQuit   operation.Step = "migrate-source-quit"   // the source's QEMU is gone
)

// MigrateSteps are the steps of the source side of a migration, in order,
// as AfterStep sees them.
func MigrateSteps() []string {
	return stepNames(stepMigPrepared, stepMigCompleted, stepMigFinalizeSent, stepMigFinalized, stepMigQuitSent, stepMigSourceQuit)
}

// migrateIntent is the source side's journal of a migration.
type migrateIntent struct {
	Local       bool     `json:"local"`
	To          string   `json:"to,omitempty"`
	Transport   []string `json:"transport,omitempty"`
	Unit        string   `json:"unit"`                // the source QEMU's
	DestUnit    string   `json:"dest_unit,omitempty"` // local: the new QEMU's
	Markers     []string `json:"markers,omitempty"`
	RelaySock   string   `json:"relay_sock,omitempty"`
	StopAndCopy bool     `json:"stop_and_copy,omitempty"`
	Autostart   bool     `json:"autostart,omitempty"`
}

func (mg *Migrator) recoverMigrateOut(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[migrateIntent](op)
	if err != nil {
		return "", err
	}
	for _, mk := range in.Markers {
		os.Remove(mk)
	}
	if in.RelaySock != "" {
		os.Remove(in.RelaySock)
	}
	os.Remove(mg.paths(name).StoppedByMigration())
	sd, err := mg.h.Systemd(ctx)
	if err != nil {
		return "", err
	}
	src, err := sd.Status(ctx, in.Unit)
	if err != nil {
		return "", err
	}
	if in.Local {
		return mg.settleLocal(ctx, name, in, sd, src)
	}
	return mg.settleRemote(ctx, name, in, op, sd, src)
}

// destAnswerTimeout bounds how long recovery waits for a destination QEMU
// that does not answer its monitor while its unit is up: one still
// starting (its sockets not bound yet), or one ending (its stream broke, so
// it exits; its unit goes once its stop-post hook ran).
const destAnswerTimeout = 30 * time.Second

// destState asks the destination QEMU of unit for its run state at the
// socket sock names (asked again each time: a hand-over renames it); ""
// when its unit ended, before or while this waited. A QEMU whose unit
// stays up and that does not answer within destAnswerTimeout is an error:
// it may run the guest, and recovery never guesses (the guardian tries
// again).
func (mg *Migrator) destState(ctx context.Context, sd *units.Manager, unit string, sock func() string) (qmp.RunState, error) {
	deadline := time.Now().Add(destAnswerTimeout)
	for {
		st, err := sd.Status(ctx, unit)
		if err != nil {
			return "", err
		}
		if st.Gone() {
			return "", nil
		}
		if state := mg.h.RunStateAt(ctx, sock()); state != "" {
			return state, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the incoming QEMU (%s) does not answer its monitor", unit)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// incomingDir is the newest incoming directory of a destination QEMU.
func incomingDir(p vmstate.Paths) string {
	dirs, _ := filepath.Glob(filepath.Join(p.Dir, "incoming-*"))
	sort.Slice(dirs, func(i, j int) bool { return modTime(dirs[i]).Before(modTime(dirs[j])) })
	if len(dirs) == 0 {
		return ""
	}
	return dirs[len(dirs)-1]
}

func modTime(p string) time.Time {
	fi, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// settleLocal settles a migration on one host: the new QEMU keeps the
// guest if it runs it (the hand-over is finished), else the source does
// (the new QEMU is removed).
func (mg *Migrator) settleLocal(ctx context.Context, name string, in migrateIntent, sd *units.Manager, src units.Status) (string, error) {
	p := mg.paths(name)
	app, err := mg.h.State().ReadApplied(name)
	if err != nil {
		return "", err
	}
	inDir := incomingDir(p)
	if app.Unit == in.DestUnit || in.DestUnit == vmstate.UnitName(name) && app.Unit == "" && src.Gone() {
		if inDir != "" {
			os.RemoveAll(inDir) // killed between the record and this
		}
		return "the new QEMU had taken over and was recorded", nil
	}
	dest, err := sd.Status(ctx, in.DestUnit)
	if err != nil {
		return "", err
	}
	var destState qmp.RunState
	if !dest.Gone() && inDir != "" {
		// The hand-over renames qmp.sock first, and only once the source's
		// QEMU is gone (before, the usual name is the source's).
		sock := func() string {
			if q := filepath.Join(inDir, "qmp.sock"); exists(q) || !src.Gone() {
				return q
			}
			return p.QMP
		}
		if destState, err = mg.destState(ctx, sd, in.DestUnit, sock); err != nil {
			return "", err
		}
	}
	switch {
	case destState == qmp.RunRunning || src.Gone() && destState == qmp.RunPaused:
		// The new QEMU has the guest: the source goes, the new one takes
		// the VM's names.
		if !src.Gone() {
			if err := mg.quitSource(ctx, sd, name, in.Unit, true); err != nil {
				return "", err
			}
		}
		if destState == qmp.RunPaused {
			if err := mg.contAt(ctx, filepath.Join(inDir, "qmp.sock")); err != nil {
				return "", err
			}
		}
		if err := mg.commitLocal(name, app, in.DestUnit, inDir); err != nil {
			return "", err
		}
		note := "the new QEMU runs the guest: the hand-over is finished"
		if fw := mg.takeForwards(ctx, name); fw != "" {
			note += "; " + fw
		}
		return note, nil
	case !src.Gone():
		mg.h.RemoveUnit(ctx, sd, in.DestUnit)
		if inDir != "" {
			os.RemoveAll(inDir)
		}
		if err := mg.resumeHere(ctx, name); err != nil {
			return "", err
		}
		return "the guest runs on in the source QEMU; the new QEMU was removed", nil
	}
	mg.h.RemoveUnit(ctx, sd, in.DestUnit)
	return "", errors.New("neither QEMU runs the guest any more (the source's is gone, the new one had not received it all)")
}

// commitLocal gives the new QEMU the VM's socket names and records it.
func (mg *Migrator) commitLocal(name string, app *vmstate.Applied, unit, inDir string) error {
	p := mg.paths(name)
	if err := handOver(inDir, p.Dir, nil); err != nil {
		return err
	}
	app.Unit, app.MigratedFrom, app.StartedAt = "", "local", time.Now().UTC()
	if unit != vmstate.UnitName(name) {
		app.Unit = unit
	}
	raw, err := os.ReadFile(p.Spec)
	if err != nil {
		return err
	}
	if err := mg.h.State().WriteApplied(app, raw); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	os.RemoveAll(inDir)
	return nil
}

// settleRemote settles a migration to another host: the source resumes
// unless the destination may run the guest; then this host's copy goes.
func (mg *Migrator) settleRemote(ctx context.Context, name string, in migrateIntent, op *operation.Op, sd *units.Manager, src units.Status) (string, error) {
	if src.Gone() {
		runs := op.Has(stepMigSourceQuit) || op.Has(stepMigFinalized)
		if !runs && op.Has(stepMigFinalizeSent) {
			runs, _ = mg.askDestination(ctx, name, in)
		}
		if runs {
			mg.dropMigrated(ctx, name, in)
			return fmt.Sprintf("the guest runs on %s: this host's records are removed", in.To), nil
		}
		return "the source's QEMU ended during the migration", nil
	}
	if op.Has(stepMigFinalized) {
		// The destination runs the guest. The source's QEMU may be quitting
		// already (its command sent quit, then died): its monitor goes
		// before its unit does, so it is not asked anything.
		if err := mg.quitSource(ctx, sd, name, in.Unit, false); err != nil {
			return "", err
		}
		mg.dropMigrated(ctx, name, in)
		return fmt.Sprintf("the guest runs on %s: this host's copy is removed", in.To), nil
	}
	c, release, err := mg.h.QMPSession(ctx, name)
	if err != nil {
		return "", err
	}
	qs, err := c.QueryStatus(ctx)
	release()
	if err != nil {
		return "", err
	}
	if qs.Running {
		return "the guest runs on the source; the destination tears its QEMU down when its transport closes", nil
	}
	destRuns := false
	if op.Has(stepMigFinalizeSent) {
		var known bool
		if destRuns, known = mg.askDestination(ctx, name, in); !known {
			if destRuns, known = mg.lockedElsewhere(name); !known {
				return "", fmt.Errorf("the destination %s may run the guest and cannot be asked (its transport fails) nor told by the disks' locks: "+
					"the source stays paused; check %s, then vmsup resume here or vmsup down here", in.To, in.To)
			}
		}
	}
	if destRuns {
		if err := mg.quitSource(ctx, sd, name, in.Unit, false); err != nil {
			return "", err
		}
		mg.dropMigrated(ctx, name, in)
		return fmt.Sprintf("the guest runs on %s: this host's copy is removed", in.To), nil
	}
	if err := mg.resumeHere(ctx, name); err != nil {
		return "", err
	}
	return "the destination does not run the guest: it runs on the source again", nil
}

// dropMigrated removes what is left here of a VM that now runs elsewhere.
func (mg *Migrator) dropMigrated(ctx context.Context, name string, in migrateIntent) {
	if err := mg.h.AfterStop(ctx, name); err != nil {
		mg.log.Warn("clean-up after migration", "vm", name, "err", err)
	}
	if err := mg.paths(name).RemoveAll(); err != nil {
		mg.log.Warn("remove state after migration", "vm", name, "err", err)
	}
	if in.Autostart {
		_ = mg.h.State().Unmark(name)
		_ = mg.h.SyncBootUnit(ctx)
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
	if c, release, err := mg.h.QMPSession(qctx, name); err == nil {
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
	c, release, err := mg.h.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	if info, err := c.QueryMigrate(ctx); err == nil && info.Status == qmp.MigrationActive {
		_ = c.MigrateCancel(ctx) // its vmsup is gone: nobody would finalize it
	}
	return migration.ResumeSource(c)
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

// askDestination asks the destination's vmsup, over the migration's
// transport, whether it runs the guest. known is false when it cannot say.
func (mg *Migrator) askDestination(ctx context.Context, name string, in migrateIntent) (runs, known bool) {
	if len(in.Transport) == 0 {
		return false, false
	}
	peer, closePeer, err := migration.Command(in.Transport, io.Discard)
	if err != nil {
		return false, false
	}
	defer closePeer()
	if r, err := peer.Call(ctx, migration.Msg{Type: migration.MsgHello, Version: migration.Version}, migration.MsgHello, helloTimeout); err != nil || r.Version != migration.Version {
		return false, false
	}
	r, err := peer.Call(ctx, migration.Msg{Type: migration.MsgQuery, Name: name}, migration.MsgState, queryTimeout)
	if err != nil {
		return false, false
	}
	return r.State == migration.StateRunning, true
}

// queryTimeout bounds a destination's answer: it first waits for its own
// receiver (which holds the VM's lock) to finish or give up.
const queryTimeout = 2 * time.Minute

// answerQuery is the destination's side of askDestination: it settles its
// own side first (its receiver may still be at work: it waits for the VM's
// lock), then says whether the guest runs here.
func (mg *Migrator) answerQuery(ctx context.Context, peer *migration.Peer, name string) error {
	reply := func(state string, err error) error {
		if err != nil {
			_ = peer.Send(migration.Msg{Type: migration.MsgError, Error: err.Error()})
			return err
		}
		return peer.Send(migration.Msg{Type: migration.MsgState, State: state})
	}
	if err := spec.ValidName(name); err != nil {
		return reply("", vmErr(name, err))
	}
	lctx, cancel := context.WithTimeout(ctx, queryTimeout-15*time.Second)
	defer cancel()
	lk, err := mg.h.State().Lock(lctx, name, "migrate-query", true)
	if err != nil {
		return reply("", err)
	}
	defer lk.Unlock()
	if _, err := mg.k.Settle(ctx, name, "migrate-query"); err != nil {
		return reply("", err)
	}
	// The VM's own sockets (not an incoming directory's): a QEMU that took
	// the guest over, running or paused since by its operator.
	if _, err := os.Stat(mg.paths(name).QMP); err != nil {
		return reply(migration.StateAbsent, nil)
	}
	c, release, err := mg.h.QMPSession(ctx, name)
	if err != nil {
		return reply("", vmErr(name, err))
	}
	defer release()
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		return reply("", vmErr(name, err))
	}
	if qs.Status == qmp.RunInMigrate || qs.Status == qmp.RunPostMigrate {
		return reply(migration.StateAbsent, nil)
	}
	return reply(migration.StateRunning, nil)
}

// lockedElsewhere tells from the shared file disks whether another QEMU
// (the destination's) holds their write locks. known is false when the VM
// has no such disk.
func (mg *Migrator) lockedElsewhere(name string) (locked, known bool) {
	v, _ := mg.h.View(name)
	if v == nil {
		return false, false
	}
	for _, d := range v.Disks {
		if d.File == "" || d.ReadOnly || d.IsCDROM() {
			continue
		}
		path := d.File
		if d.Type == spec.DiskFile {
			path = d.Active.Path // the image QEMU writes
		}
		l, err := storage.WriteLocked(path)
		if err != nil {
			continue
		}
		if l {
			return true, true
		}
		known = true
	}
	return false, known
}

// incomingIntent is a migration destination's journal (another host).
type incomingIntent struct {
	Unit      string            `json:"unit"`
	Existed   bool              `json:"existed"` // the VM had a state directory here before
	Autostart bool              `json:"autostart,omitempty"`
	App       *vmstate.Applied  `json:"app,omitempty"` // what commit records
	Raw       []byte            `json:"raw,omitempty"`
	Markers   map[string]string `json:"-"`
}

// recoverMigrateIn settles a destination whose receiver died: the guest
// runs here if its QEMU was started (then it is recorded); else all of it
// is torn down and the source keeps the guest.
func (mg *Migrator) recoverMigrateIn(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[incomingIntent](op)
	if err != nil {
		return "", err
	}
	sd, err := mg.h.Systemd(ctx)
	if err != nil {
		return "", err
	}
	st, err := sd.Status(ctx, in.Unit)
	if err != nil {
		return "", err
	}
	p := mg.paths(name)
	inDir := incomingDir(p)
	if !st.Gone() && inDir == "" {
		// The incoming directory goes last, after the record: committed.
		if in.Autostart {
			_ = mg.enableApplied(ctx, name)
		}
		return "the guest runs here: the migration had been recorded", nil
	}
	var state qmp.RunState
	if !st.Gone() && inDir != "" {
		// The hand-over renames qmp.sock first: once it is gone from the
		// incoming directory, the VM's usual name reaches this QEMU.
		sock := func() string {
			if q := filepath.Join(inDir, "qmp.sock"); exists(q) || !exists(p.QMP) {
				return q
			}
			return p.QMP
		}
		if state, err = mg.destState(ctx, sd, in.Unit, sock); err != nil {
			return "", err
		}
	}
	if state == qmp.RunRunning && in.App != nil {
		// The guest runs here (cont was sent): finish the hand-over.
		if err := handOver(inDir, p.Dir, nil); err != nil {
			return "", err
		}
		in.App.StartedAt = time.Now().UTC()
		if err := mg.h.State().WriteApplied(in.App, in.Raw); err != nil {
			return "", fmt.Errorf("record: %w", err)
		}
		os.RemoveAll(inDir)
		if in.Autostart {
			_ = mg.enableApplied(ctx, name)
		}
		return "the guest runs here: the hand-over is finished and recorded", nil
	}
	mg.h.RemoveUnit(ctx, sd, in.Unit)
	if err := mg.h.AfterStop(ctx, name); err != nil {
		return "", err
	}
	if inDir != "" {
		os.RemoveAll(inDir)
	}
	if !in.Existed {
		if err := p.RemoveAll(); err != nil {
			return "", err
		}
	}
	return "the incoming QEMU had not taken over: it is torn down", nil
}

// takeForwards gives the VM's QEMU, new after a local migration, its user
// NICs' host forwards (forwards.go); the note says what could not be added.
func (mg *Migrator) takeForwards(ctx context.Context, name string) string {
	v, err := mg.h.View(name)
	if err != nil {
		return "forwards: " + err.Error()
	}
	vm := v.Booted
	c, release, err := mg.h.QMPSession(ctx, name)
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
	if _, err := mg.h.State().Mark(name, mg.paths(name).Spec); err != nil {
		return err
	}
	return mg.h.SyncBootUnit(ctx)
}
