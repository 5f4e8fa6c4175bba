package livemigrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/console/consolelog"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	vmnet "github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The source side of a live migration (the design: doc.go).

// KindOut is a migration's operation in the journal, on the source.
const KindOut operation.Kind = "migrate"

// Migrate moves the running VM name to another host (o.To) or into a new
// QEMU on this host (o.Local).
func (mg *Migrator) Migrate(ctx context.Context, name string, o migwire.Options) (migwire.Result, error) {
	if err := spec.ValidName(name); err != nil {
		return migwire.Result{}, vmerr.Wrap(name, err)
	}
	if !o.Local && o.To == "" {
		return migwire.Result{}, vmerr.Wrap(name, errors.New("migrate: no destination (give a host or local)"))
	}
	m := &outgoing{mg: mg, name: name, o: o.WithDefaults(), start: time.Now(), p: mg.paths(name)}
	m.res.VM, m.res.To = name, m.o.To
	if m.o.Local {
		m.res.To = "local"
	}
	defer m.close()
	if err := m.load(ctx); err != nil {
		return m.res, vmerr.Wrap(name, err)
	}
	if err := m.journal(ctx); err != nil {
		return m.res, vmerr.Wrap(name, err)
	}
	r, err := m.prepare(ctx)
	if err != nil {
		return m.res, err
	}
	if err := m.mirror(ctx, r); err != nil {
		return m.res, err
	}
	if err := m.stream(ctx, r); err != nil {
		return m.res, err
	}
	if err := m.finalize(ctx); err != nil {
		return m.res, err
	}
	if err := m.handOver(ctx); err != nil {
		return m.res, err
	}
	m.res.Wall = time.Since(m.start)
	return m.res, nil
}

// outgoing is the source side of one migration.
type outgoing struct {
	mg    *Migrator
	name  string
	o     migwire.Options
	start time.Time
	p     vmstore.Paths
	lu    *lockedUnit
	app   *vmstore.Applied
	f     *spec.File
	raw   []byte
	mon   *qmp.Conn // the source QEMU's event monitor
	peer  *migwire.Peer
	prep  migwire.Msg
	res   migwire.Result
	op    *operation.Op // the journal: a killed migration is settled by the next command
	in    migrateIntent
	cpr   bool // the new QEMU takes the guest's RAM in place (cpr.go)
	move  bool // a shut-off VM's disks and record (move_out.go): m.mon is a storage daemon's
	// cands are the disks the destination may take a copy of, copies
	// those it does (storage_out.go); mirrorsEnded: their jobs ended at
	// the switch-over.
	cands        []migwire.DiskCopy
	copies       []migwire.DiskCopy
	mirrorsEnded bool
	// stopped is when the source's guest stopped (its STOP event).
	stopped time.Time
	// finalized: the destination answered finalize (or may have): from
	// then on no way out aborts it.
	finalized bool
	// unsettled: it failed with the guest not surely running here; the
	// journal stays for the next command to settle (recoverMigrateOut).
	unsettled bool
	cleanups  []func() // run by close, newest first
}

func (m *outgoing) fail(step, running string, err error) error {
	m.unsettled = running != "source"
	e := &Error{VM: m.name, Step: step, Running: running, Err: err}
	if m.move {
		e.Op = "move"
	}
	return e
}

func (m *outgoing) close() {
	for i := len(m.cleanups) - 1; i >= 0; i-- {
		m.cleanups[i]()
	}
}

// lockedUnit is the VM's lock held, the systemd connection, and the VM's
// unit and its state read under the lock.
type lockedUnit struct {
	sd   *units.Manager
	lk   *operation.Lock
	unit string
	st   units.Status
}

// lockUnit takes the VM's lock (settling what a killed command left), then
// reads its unit's state.
func (mg *Migrator) lockUnit(ctx context.Context, name, by string) (*lockedUnit, error) {
	sd, err := mg.env.Systemd(ctx)
	if err != nil {
		return nil, err
	}
	lk, _, err := mg.k.Lock(ctx, name, by)
	if err != nil {
		return nil, err
	}
	u := &lockedUnit{sd: sd, lk: lk, unit: mg.env.State().UnitOf(name)}
	if u.st, err = sd.Status(ctx, u.unit); err != nil {
		lk.Unlock()
		return nil, err
	}
	return u, nil
}

func (u *lockedUnit) unlock() { u.lk.Unlock() }

// load takes the VM's lock and checks that it can go: running, no
// hot-plugged devices or live resize the destination could not recreate.
func (m *outgoing) load(ctx context.Context) (err error) {
	mg, name, p := m.mg, m.name, m.p
	if m.lu, err = mg.lockUnit(ctx, name, "migrate"); err != nil {
		return err
	}
	m.cleanups = append(m.cleanups, m.lu.unlock)
	if !m.lu.st.Exists || m.lu.st.ActiveState != "active" {
		return vmstore.ErrNotRunning
	}
	v, err := mg.env.View(name)
	if err != nil {
		return err
	}
	m.app = v.Applied
	if err := migratable(v, m.o.Local); err != nil {
		return err
	}
	if m.raw, err = os.ReadFile(p.Spec); err != nil {
		return err
	}
	if m.f, err = spec.Parse(cmp.Or(m.app.SourceFile, p.Spec), m.raw); err != nil {
		return fmt.Errorf("applied spec: %w", err)
	}
	if m.o.Local {
		for _, n := range m.f.VM.NICs {
			// A tap takes one QEMU at a time: the new QEMU gets a second
			// one on the same bridge (vmnet.MoveSteps), which not every
			// NIC type can have.
			if err := vmnet.CanMove(n); err != nil {
				return fmt.Errorf("migrate --local: %w", err)
			}
		}
	}
	// The event monitor, not qmp.sock: status, console and "migrate
	// --cancel" keep working on the command monitor meanwhile.
	dctx, dcancel := context.WithTimeout(ctx, qmpConnectTimeout)
	m.mon, err = qmp.Dial(dctx, p.Events, qmp.WithLogger(mg.log), qmp.WithoutSymlink(), qmp.WithCommandTimeout(monitorCommandTimeout))
	dcancel()
	if err != nil {
		return fmt.Errorf("event monitor: %w", err)
	}
	m.cleanups = append(m.cleanups, func() { m.mon.Close() })
	if qs, err := m.mon.QueryStatus(ctx); err != nil {
		return fmt.Errorf("query-status: %w", err)
	} else if !qs.Running {
		return fmt.Errorf("QEMU is %q, not running; resume it first", qs.Status)
	}
	if !m.o.Local {
		if m.cands, err = m.diskCandidates(ctx); err != nil {
			return err
		}
	}
	m.cpr, m.res.ModeNote = decideMode(m.o, &m.f.VM, m.app.RAM, func() (bool, string) { return mg.env.CPRTransfer(ctx) })
	m.res.Mode = migwire.ModeNormal
	if m.cpr {
		m.res.Mode = migwire.ModeCPRTransfer
	}
	return nil
}

// migratable refuses a VM whose running view the destination, built from
// the spec, could not recreate (or, on another host, could not reach).
func migratable(v *vmstore.View, local bool) error {
	var attached, nics int
	for _, d := range v.Disks {
		if d.Attached {
			attached++
		}
	}
	for _, n := range v.NICs {
		if n.Attached {
			nics++
		}
	}
	moved := slices.ContainsFunc(v.Disks, func(d vmstore.Disk) bool { return d.MovedFrom != "" })
	switch r := v.Applied.Resized; {
	case !v.Tree.Empty() && !local:
		return errors.New("migrate: the VM has snapshots, whose images are on this host: remove them first (vmsup snapshot rm)")
	case moved && !local:
		return errors.New("migrate: a disk was moved (vmsup disk move) and the VM's file still names its old image: update the file and restart the VM first")
	case attached > 0 || nics > 0:
		// The destination QEMU is built from the spec: its devices would not
		// match the source's and QEMU would refuse the stream.
		return fmt.Errorf("migrate: %d hot-plugged disk(s) and %d NIC(s) are not migrated (the destination starts from the spec file): detach them first",
			attached, nics)
	case v.Applied.Replugged:
		return errors.New("migrate: vmsup apply plugged or unplugged devices since it booted, so the destination could not rebuild its device layout from the spec: restart it first (vmsup apply --restart)")
	case r != nil:
		return fmt.Errorf("migrate: its vCPUs or memory were changed live (vmsup set: %d vCPUs, %s); the destination starts from the spec file and could not take them: restart it with the new sizes in its file first",
			r.CPUs, r.Memory)
	}
	return nil
}

// journal records the migration's intent before anything is made: the
// next command on the VM settles a migration whose vmsup died
// (recoverMigrateOut). The markers are made here, recorded first.
func (m *outgoing) journal(ctx context.Context) (err error) {
	m.in = migrateIntent{Local: m.o.Local, To: m.o.To, Transport: m.o.Transport, Unit: m.lu.unit, KeepDisks: m.o.KeepSourceDisks,
		StopAndCopy: migwire.TCGStopAndCopy && m.app.Accel == spec.AccelTCG && !m.cpr, Autostart: !m.o.Local && m.mg.env.State().IsMarked(m.name)}
	if m.o.Local {
		m.in.DestUnit = vmstore.AltUnit(m.name, m.lu.unit)
	}
	var stopGuard func()
	guard := func() func() { return m.mg.env.Guard(ctx, m.name) }
	kind := KindOut
	if len(m.cands) > 0 {
		kind = KindOutStorage // its recovery also cleans up the copies
	}
	if m.move {
		kind = KindMove
	}
	if m.op, stopGuard, err = m.mg.k.BeginGuarded(ctx, m.name, kind, m.in, guard); err != nil {
		return err
	}
	m.cleanups = append(m.cleanups, func() {
		if !m.unsettled { // else the guardian settles it once this command is gone
			m.op.End()
			stopGuard()
		}
	})
	if !m.o.Local {
		plan := migwire.PlanMarkers(m.name, m.f)
		for _, mk := range plan {
			m.in.Markers = append(m.in.Markers, mk)
		}
		if err := m.op.SetIntent(m.in); err != nil {
			return err
		}
		markers, cleanup := migwire.MakeMarkers(plan)
		m.cleanups = append(m.cleanups, cleanup)
		m.prep.Markers = markers
	}
	return nil
}

// step journals a step of the migration, then Options.AfterStep sees it.
func (m *outgoing) step(name operation.Step) { m.op.Step(name) }

// prepare starts the receiver and has it start the destination QEMU.
func (m *outgoing) prepare(ctx context.Context) (migwire.Msg, error) {
	mg, name, o := m.mg, m.name, m.o
	peer, closePeer, err := mg.openTransport(ctx, o)
	if err != nil {
		return migwire.Msg{}, m.fail("transport", "source", err)
	}
	m.peer = peer
	// Until finalize is answered, any way out tears the destination down.
	m.cleanups = append(m.cleanups, func() {
		if !m.finalized {
			_ = peer.Send(migwire.Msg{Type: migwire.MsgAbort})
		}
		closePeer()
	})
	if r, err := peer.Call(ctx, migwire.Msg{Type: migwire.MsgHello, Version: migwire.Version}, migwire.MsgHello, helloTimeout); err != nil {
		return r, m.fail("hello", "source", err)
	} else if r.Version != migwire.Version {
		return r, m.fail("hello", "source", fmt.Errorf("destination speaks protocol version %d, want %d", r.Version, migwire.Version))
	}
	host, _ := os.Hostname()
	app := m.app
	m.prep = migwire.Msg{
		Type: migwire.MsgPrepare, Name: name, SourceFile: app.SourceFile, Spec: m.raw, Accel: app.Accel,
		CPUModel: app.CPUModel, CPUMasks: app.CPUMasks, Machine: app.Machine, UUID: app.UUID, GenID: app.GenID,
		Listen: o.Address, Multifd: o.Multifd, Postcopy: o.Postcopy, Markers: m.prep.Markers,
		From: host, Timeout: o.Timeout, CPR: m.cpr, Disks: m.cands,
	}
	if app.RAM != nil {
		m.prep.RAMID = app.RAM.ID
	}
	if o.Local {
		m.prep.From = "local"
	} else if m.prep.Autostart = mg.env.State().IsMarked(name); m.f.VM.Boot.Firmware == spec.FirmwareUEFI {
		// (A shut-off VM never started has none yet.)
		if m.prep.UEFIVars, err = os.ReadFile(m.p.UEFIVars); err != nil && !(m.move && errors.Is(err, os.ErrNotExist)) {
			return migwire.Msg{}, m.fail("prepare", "source", fmt.Errorf("UEFI variable store: %w", err))
		}
	}
	wait, done := prepareTimeout, stepMigPrepared
	if slices.ContainsFunc(m.cands, func(c migwire.DiskCopy) bool { return c.Image != "" }) {
		wait += m.o.Timeout // the destination may pull an image first (haveImage)
	}
	if m.move {
		m.prep.Type, m.prep.Multifd, m.prep.Postcopy, done = migwire.MsgMove, 0, false, stepMovePrepared
	}
	r, err := peer.Call(ctx, m.prep, migwire.MsgPrepared, wait)
	if err != nil {
		return r, m.fail("prepare", "source", err)
	}
	if m.cpr && r.CPRSocket == "" {
		m.cpr, m.res.Mode, m.res.ModeNote = false, migwire.ModeNormal, "the destination did not take the guest's RAM in place"
	}
	mg.log.Debug("destination ready", "vm", name, "uri", r.URI, "cpr", r.CPRSocket)
	m.step(done)
	return r, nil
}

// relay is where the source QEMU streams to: the destination's own socket
// on one host; across hosts, a unix socket of vmsup's whose connections it
// relays to the destination's relay over TCP and TLS.
func (m *outgoing) relay(ctx context.Context, r migwire.Msg) (string, error) {
	if m.o.Local {
		return r.URI, nil
	}
	addr, ok := strings.CutPrefix(r.URI, "tcp:")
	if !ok {
		return "", m.fail("prepare", "source", fmt.Errorf("destination gave %q, want tcp:HOST:PORT", r.URI))
	}
	sock := filepath.Join(m.p.Dir, "migrate-out-"+migwire.RandHex(6)+".sock")
	m.in.RelaySock = sock
	if err := m.op.SetIntent(m.in); err != nil {
		return "", m.fail("relay", "source", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return "", m.fail("relay", "source", err)
	}
	if err := vmstore.ChownLike(sock, m.p.Dir); err != nil {
		ln.Close()
		return "", m.fail("relay", "source", err)
	}
	dial := func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		c, err := m.o.Dial(dctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return migwire.DialTLS(dctx, c, r.CertPin)
	}
	relay := migwire.StartRelay(ln, dial, nil, migwire.SendToken(r.Token), m.mg.log)
	m.cleanups = append(m.cleanups, func() { relay.Close(); os.Remove(sock) })
	return "unix:" + sock, nil
}

// stream runs the migration; on failure the guest runs on here.
func (m *outgoing) stream(ctx context.Context, r migwire.Msg) error {
	uri, err := m.relay(ctx, r)
	if err != nil {
		return err
	}
	stopped := "" // a live copy
	if m.in.StopAndCopy {
		stopped = m.p.StoppedByMigration()
		m.cleanups = append(m.cleanups, func() { os.Remove(stopped) })
	}
	m.res.StopAndCopy = stopped != ""
	onPostcopy := func() error {
		_, err := m.peer.Call(context.WithoutCancel(ctx), migwire.Msg{Type: migwire.MsgRun}, migwire.MsgRunning, finalizeTimeout)
		return err
	}
	run := migwire.Run{Mon: m.mon, URI: uri, Mode: modeParam(m.cpr, m.app.RAM), Opts: m.o, StoppedMark: stopped,
		Start: m.start, OnPostcopy: onPostcopy, Log: m.mg.log}
	if len(m.copies) > 0 {
		run.PreSwitchover, run.DiskProgress = m.endMirrors, m.diskProgress
	}
	if m.cpr {
		run.CPR = r.CPRSocket
		run.Listen = func() error {
			_, err := m.peer.Call(context.WithoutCancel(ctx), migwire.Msg{Type: migwire.MsgListen}, migwire.MsgListening, prepareTimeout)
			return err
		}
	}
	out, err := migwire.Stream(ctx, run)
	info := out.Info
	m.res.Postcopy, m.stopped = out.Postcopy, out.Stopped
	if err != nil {
		running := "source"
		if m.mon.Err() != nil {
			running = "none (the source's QEMU died; the destination was torn down)"
		} else if out.Postcopy {
			running = "none (failed during postcopy)"
		} else if rerr := migwire.ResumeSource(m.mon); rerr != nil {
			running = "none? (" + rerr.Error() + ")"
		}
		return m.fail("stream", running, err)
	}
	m.res.TotalTime = time.Duration(info.TotalTime) * time.Millisecond
	m.res.Downtime = time.Duration(info.Downtime) * time.Millisecond
	m.res.SetupTime = time.Duration(info.SetupTime) * time.Millisecond
	if info.RAM != nil {
		m.res.Transferred = info.RAM.Transferred
	}
	m.step(stepMigCompleted)
	return nil
}

// finalize has the destination check the stream and run the guest.
func (m *outgoing) finalize(ctx context.Context) error {
	handoverStart := time.Now()
	fin := migwire.Msg{Type: migwire.MsgFinalize}
	if !m.o.Local {
		if t, err := consolelog.ReadBack(m.mg.env.ConsoleConfig(m.name), 4<<20); err == nil {
			fin.Console = t.Data
		}
	}
	// Journaled before it is sent: from here the destination may run the
	// guest, and only it can say whether it does.
	m.step(stepMigFinalizeSent)
	r, err := m.peer.Call(ctx, fin, migwire.MsgFinalized, finalizeTimeout)
	if err != nil {
		var re *migwire.RemoteError
		if errors.As(err, &re) {
			// The destination said no and tears itself down: run here.
			if rerr := migwire.ResumeSource(m.mon); rerr != nil {
				return m.fail("finalize", "none? ("+rerr.Error()+")", err)
			}
			return m.fail("finalize", "source", err)
		}
		// No answer: the destination may be running the guest. Stay paused.
		m.finalized = true
		return m.fail("finalize", "source (paused; check the destination before resuming it here)", err)
	}
	m.finalized = true
	m.res.Handover = time.Since(handoverStart)
	if m.o.Local && !m.stopped.IsZero() && r.Resumed.After(m.stopped) {
		m.res.Pause = r.Resumed.Sub(m.stopped) // both QEMUs' clocks are this host's
	}
	m.step(stepMigFinalized)
	return nil
}

// handOver ends the source's QEMU, which holds a stale copy now: on one
// host the new QEMU then takes the usual socket names; across hosts
// nothing of the VM stays here.
func (m *outgoing) handOver(ctx context.Context) error {
	mg, name, p := m.mg, m.name, m.p
	sd, unit := m.lu.sd, m.lu.unit
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer qcancel()
	if m.o.Local {
		// The old unit's stop-post hook must leave the VM's network and
		// grants to the new QEMU (see StopPost).
		_ = os.WriteFile(p.Handover(), nil, 0o600)
		defer os.Remove(p.Handover())
	}
	_ = m.mon.Quit(qctx)
	m.step(stepMigQuitSent) // (its monitor goes before its unit does)
	if err := sd.WaitStopped(qctx, unit); err != nil {
		sd.KillAndWait(qctx, unit)
	}
	m.step(stepMigSourceQuit)
	if m.o.Local {
		if _, err := m.peer.Call(qctx, migwire.Msg{Type: migwire.MsgCommit}, migwire.MsgCommitted, finalizeTimeout); err != nil {
			return m.fail("commit", "destination (new QEMU; sockets not handed over)", err)
		}
		m.res.Unit = mg.env.State().UnitOf(name)
		return nil
	}
	// The VM now belongs to the destination: nothing of it stays here.
	if err := mg.env.AfterStop(qctx, name); err != nil {
		mg.log.Warn("clean-up after migration", "vm", name, "err", err)
	}
	// Before the state directory, which holds the journal that names them.
	mg.removeSourceCopies(name, m.in.Copies, m.o.KeepSourceDisks)
	if err := p.RemoveAll(); err != nil {
		mg.log.Warn("remove state after migration", "vm", name, "err", err)
	}
	if m.prep.Autostart { // the destination enabled it: a reboot here must not start a copy
		if err := mg.env.Disable(qctx, name); err != nil {
			mg.log.Warn("disable autostart after migration", "vm", name, "err", err)
		}
	}
	return nil
}

// openTransport starts the receiver: in-process for a local migration, else
// the transport command. closePeer ends it and waits (bounded) for it.
func (mg *Migrator) openTransport(ctx context.Context, o migwire.Options) (*migwire.Peer, func(), error) {
	if !o.Local {
		return migwire.Command(o.Transport, o.Stderr)
	}
	peer, closePeer := migwire.InProcess(func(p *migwire.Peer) {
		// Not ctx: a Ctrl-C must reach the destination as an abort after
		// migrate_cancel, not kill it mid-way.
		if err := mg.receive(context.WithoutCancel(ctx), p, true); err != nil {
			mg.log.Debug("local receiver", "err", err)
		}
	})
	return peer, closePeer, nil
}

// Cancel cancels the VM's outgoing migration (QMP migrate_cancel); the
// vmsup migrating it then tears the destination down and the guest keeps
// running here.
func (mg *Migrator) Cancel(ctx context.Context, name string) error {
	c, release, err := mg.env.QMPSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	info, err := c.QueryMigrate(ctx)
	if err != nil {
		return vmerr.Wrap(name, err)
	}
	switch info.Status {
	case qmp.MigrationSetup, qmp.MigrationActive, qmp.MigrationPreSwitchover, qmp.MigrationDevice, qmp.MigrationWaitUnplug:
	case qmp.MigrationPostcopyActive:
		return vmerr.Wrap(name, errors.New("the migration is in postcopy: the guest already runs on the destination, it cannot be cancelled"))
	default:
		if n := cancelMirrors(ctx, c); n > 0 { // the disks' copy, before the RAM
			return nil
		}
		return vmerr.Wrap(name, fmt.Errorf("no migration in progress (status %q)", cmp.Or(info.Status, qmp.MigrationNone)))
	}
	if err := c.MigrateCancel(ctx); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("migrate_cancel: %w", err))
	}
	return nil
}
