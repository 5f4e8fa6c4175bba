package livemigrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/livesettings"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Timeouts of the migration protocol's steps (the migration itself is
// bounded by migwire.Options.Timeout).
const (
	helloTimeout    = 30 * time.Second
	prepareTimeout  = 90 * time.Second // QEMU start under a loaded TCG host
	finalizeTimeout = 60 * time.Second
)

// KindIn is a migration's operation in the journal, on a destination on
// another host.
const KindIn operation.Kind = "migrate-receive"

// errAborted is the source's abort (or its vanishing) before finalize.
var errAborted = errors.New("migration aborted by the source; destination torn down")

// Receive serves one incoming migration over r (the source's requests) and
// w (replies): it is "vmsup migrate-receive", run by the source through its
// transport. Everything it sets up is torn down again unless the source
// finalizes; the guest then runs here and the VM's state lives under this
// host's Root.
func (mg *Migrator) Receive(ctx context.Context, r io.Reader, w io.Writer) error {
	return mg.receive(ctx, migwire.NewPeer(r, w), false)
}

func (mg *Migrator) receive(ctx context.Context, peer *migwire.Peer, local bool) error {
	m, err := peer.Recv(ctx, helloTimeout)
	if err != nil {
		return fmt.Errorf("migrate-receive: hello: %w", err)
	}
	if m.Type != migwire.MsgHello || m.Version != migwire.Version {
		_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: fmt.Sprintf("this vmsup speaks migration protocol version %d, got %q version %d", migwire.Version, m.Type, m.Version)})
		return fmt.Errorf("migrate-receive: protocol version %d not supported (want %d)", m.Version, migwire.Version)
	}
	host, _ := os.Hostname()
	if err := peer.Send(migwire.Msg{Type: migwire.MsgHello, Version: migwire.Version, Host: host}); err != nil {
		return err
	}
	m, err = peer.Recv(ctx, helloTimeout)
	if err != nil || m.Type == migwire.MsgAbort {
		return errAborted
	}
	if m.Type == migwire.MsgQuery {
		return mg.answerQuery(ctx, peer, m.Name)
	}
	if m.Type == migwire.MsgMove && !local {
		return mg.receiveMove(ctx, peer, m)
	}
	if m.Type != migwire.MsgPrepare {
		return fmt.Errorf("migrate-receive: want prepare, got %q", m.Type)
	}
	m.Local = local
	d := &incomingVM{mg: mg, local: local, autostart: m.Autostart && !local}
	defer func() {
		if !d.finalized {
			d.teardown(ctx)
		}
		if d.st != nil {
			d.st.Release()
		}
		if d.relay != nil {
			d.relay.Close() // idempotent; after finalize the stream is done
		}
		if d.nbdRelay != nil {
			d.nbdRelay.Close()
		}
		if d.mon != nil {
			d.mon.Close()
		}
	}()
	uri, err := d.prepare(ctx, m)
	if err != nil {
		err = vmerr.Wrap(m.Name, err)
		_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
		return err
	}
	if err := peer.Send(migwire.Msg{Type: migwire.MsgPrepared, URI: uri, Token: d.token, CertPin: d.certPin, CPRSocket: d.cprSock,
		Disks: d.copies, NBD: d.nbdURI}); err != nil {
		return err
	}
	m, err, runErr := d.awaitFinalize(ctx, peer)
	if runErr != nil {
		return runErr
	}
	if err != nil || m.Type != migwire.MsgFinalize {
		if d.postcopy {
			// The newest guest state is here and nowhere else: keep it
			// for the operator (QEMU's postcopy recovery), do not kill it.
			d.finalized = true
			return vmerr.Wrap(d.name, fmt.Errorf("source went away during postcopy; the destination QEMU (%s) is left as it is", d.st.Unit()))
		}
		return errAborted
	}
	if err := d.finalize(ctx, m); err != nil {
		err = vmerr.Wrap(d.name, err)
		_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
		return err
	}
	if err := peer.Send(migwire.Msg{Type: migwire.MsgFinalized, Resumed: d.resumed}); err != nil {
		return err
	}
	if !local {
		return nil
	}
	return d.awaitCommit(ctx, peer)
}

// awaitFinalize waits for the source's finalize while the QEMUs stream
// (the source bounds it with its timeout), running the guest here at once
// if the source switches to postcopy, or listening for the stream once a
// cpr-transfer's source sent its state; runErr is a failure to do either.
func (d *incomingVM) awaitFinalize(ctx context.Context, peer *migwire.Peer) (m migwire.Msg, err, runErr error) {
	for {
		if m, err = peer.Recv(ctx, d.wait); err != nil || m.Type != migwire.MsgRun && m.Type != migwire.MsgListen {
			return m, err, nil
		}
		do, reply := d.runPostcopy, migwire.MsgRunning
		if m.Type == migwire.MsgListen {
			do, reply = d.listenCPR, migwire.MsgListening
		}
		if err := do(ctx); err != nil {
			_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
			return m, nil, err
		}
		if err := peer.Send(migwire.Msg{Type: reply}); err != nil {
			return m, nil, err
		}
	}
}

// awaitCommit, on one host: the source's QEMU quits, then its sockets'
// names become ours.
func (d *incomingVM) awaitCommit(ctx context.Context, peer *migwire.Peer) error {
	m, err := peer.Recv(ctx, finalizeTimeout)
	if err == nil && m.Type != migwire.MsgCommit {
		err = fmt.Errorf("got %q", m.Type)
	}
	if err != nil {
		return vmerr.Wrap(d.name, fmt.Errorf("source did not hand over (%v); the new QEMU runs as %s", err, d.st.Unit()))
	}
	if err := d.commit(); err != nil {
		_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
		return err
	}
	return peer.Send(migwire.Msg{Type: migwire.MsgCommitted})
}

// incomingVM is the destination side of one migration: a QEMU started by
// the start pipeline (StartIncoming, StartIncomingLocal) with -incoming
// under its own unit, its sockets in an incoming directory until it takes
// over, and the undo that removes all of it unless the source finalizes.
type incomingVM struct {
	mg        *Migrator
	name      string
	f         *spec.File
	p         vmstore.Paths     // the VM's
	st        *machine.Incoming // the start pipeline's run
	local     bool
	mon       *qmp.Conn             // the destination QEMU's event monitor
	undo      func(context.Context) // what the pipeline made; nil once kept or undone
	finalized bool
	autostart bool           // enable for boot here once running (cross-host)
	postcopy  bool           // the guest already runs here (postcopy)
	relay     *migwire.Relay // cross-host: TCP -> QEMU's unix socket
	token     string
	certPin   string        // the relay's TLS certificate, for the source to pin
	wait      time.Duration // how long to wait for finalize
	uri       string        // where the source's QEMU sends the stream
	cprSock   string        // cpr-transfer: the new QEMU's cpr channel
	resumed   time.Time     // when the guest resumed here (its RESUME event)
	// Storage migration (storage_in.go): the disks copied here, the NBD
	// server's state and its relay.
	copies   []migwire.DiskCopy
	nbdOn    bool
	nbdRelay *migwire.Relay
	nbdURI   string
}

// intent is the destination's journal on another host (StartArgs.Intent).
func (d *incomingVM) intent(unit string, existed bool, app *vmstore.Applied, raw []byte) any {
	return incomingIntent{Unit: unit, Existed: existed, Autostart: d.autostart, App: app, Raw: raw, Copies: d.copyFiles()}
}

func (d *incomingVM) teardown(ctx context.Context) {
	if d.undo != nil {
		d.undo(ctx)
		d.undo = nil
	}
}

// prepare starts the destination QEMU through the start pipeline and
// returns where the source's QEMU sends the stream.
func (d *incomingVM) prepare(ctx context.Context, m migwire.Msg) (string, error) {
	mg := d.mg
	if err := spec.ValidName(m.Name); err != nil {
		return "", err
	}
	d.wait = 24 * time.Hour
	if m.Timeout > 0 {
		d.wait = m.Timeout + 2*time.Minute
	}
	f, err := d.parseSpec(ctx, m)
	if err != nil {
		return "", err
	}
	if !d.local {
		if d.copies, err = d.planCopies(ctx, m); err != nil {
			return "", err
		}
	}
	a := StartArgs{
		Accel: m.Accel, CPUModel: m.CPUModel, CPUMasks: m.CPUMasks, Machine: m.Machine, IDs: identity.IDs{UUID: m.UUID, GenID: m.GenID},
		RAMID: m.RAMID, CPR: m.CPR && d.local,
		SourceFile: m.SourceFile, From: m.From,
		Markers: m.Markers, UEFIVars: m.UEFIVars,
		Listen:  func(ctx context.Context) error { return d.listen(ctx, m) },
		Journal: KindIn, Intent: d.intent, // with the autostart
	}
	d.copyArgs(&a)
	d.st = mg.env.StartIncoming(f, d.local, a)
	undo, err := d.st.Run(ctx)
	if err != nil {
		return "", err
	}
	d.undo = undo
	return d.uri, nil
}

// parseSpec reads the source's spec: its name must be the VM's and, from
// another host, its paths in this host's places.
func (d *incomingVM) parseSpec(ctx context.Context, m migwire.Msg) (*spec.File, error) {
	f, err := spec.Parse(cmp.Or(m.SourceFile, d.mg.paths(m.Name).Spec), m.Spec)
	if err != nil {
		return nil, fmt.Errorf("spec from the source: %w", err)
	}
	if f.VM.Name != m.Name {
		return nil, fmt.Errorf("spec names VM %q", f.VM.Name)
	}
	if !d.local {
		if err := d.mg.env.CheckPaths(ctx, f); err != nil {
			return nil, fmt.Errorf("spec from the source: %w", err)
		}
	}
	d.name, d.f, d.p = f.VM.Name, f, d.mg.paths(f.VM.Name)
	return f, nil
}

// listen is the pipeline's incoming step: QEMU's monitor answers, it waits
// for a migration, and it listens on a unix socket; across hosts vmsup
// relays TCP (with TLS and the token) to it, so QEMU itself needs no
// network.
func (d *incomingVM) listen(ctx context.Context, m migwire.Msg) error {
	if m.CPR && d.local {
		return d.awaitCPRChannel(ctx) // it listens when asked (listenCPR)
	}
	if err := d.dialMonitor(ctx); err != nil {
		return err
	}
	if qs, err := d.mon.QueryStatus(ctx); err != nil {
		return fmt.Errorf("new QEMU: query-status: %w", err)
	} else if qs.Status != qmp.RunInMigrate {
		return fmt.Errorf("new QEMU is %q, not waiting for a migration", qs.Status)
	}
	if err := d.mon.MigrateSetCapabilities(ctx, migwire.Caps(m.Multifd, m.Postcopy, false)); err != nil {
		return fmt.Errorf("migration capabilities: %w", err)
	}
	if m.Multifd > 0 {
		n := int64(m.Multifd)
		if err := d.mon.MigrateSetParameters(ctx, qmp.MigrationParameters{MultifdChannels: &n}); err != nil {
			return fmt.Errorf("multifd channels: %w", err)
		}
	}
	sock := filepath.Join(d.st.Sockets().Dir, "migrate.sock")
	d.uri = "unix:" + sock
	if err := d.mon.MigrateIncoming(ctx, d.uri); err != nil {
		return fmt.Errorf("listen for the migration on %s: %w", d.uri, err)
	}
	if d.local {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(m.Listen, "0"))
	if err != nil {
		return fmt.Errorf("listen for the migration stream: %w", err)
	}
	rt, err := migwire.NewTLS()
	if err != nil {
		ln.Close()
		return fmt.Errorf("relay certificate: %w", err)
	}
	d.token, d.certPin = migwire.NewToken(), rt.Pin
	d.relay = migwire.StartRelay(rt.Listen(ln), func() (net.Conn, error) { return qmp.DialSocket(context.Background(), sock) },
		migwire.CheckToken(d.token), nil, d.mg.log)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	d.uri = "tcp:" + net.JoinHostPort(m.Listen, port)
	return d.exportCopies(ctx, m.Listen, rt.Listen)
}

// dialMonitor waits for the new QEMU's event monitor (or its unit failing).
func (d *incomingVM) dialMonitor(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	sd, err := d.mg.env.Systemd(ctx)
	if err != nil {
		return err
	}
	unit, events := d.st.Unit(), d.st.Sockets().Events
	for {
		st, err := sd.Status(ctx, unit)
		if err != nil {
			return err
		}
		if st.Gone() {
			return fmt.Errorf("QEMU exited (%s): %s", cmp.Or(st.ExitReason(), st.ActiveState), d.mg.env.LastWords(ctx, unit))
		}
		if _, err := os.Stat(events); err == nil {
			dctx, dcancel := context.WithTimeout(ctx, qmpConnectTimeout)
			c, err := qmp.Dial(dctx, events, qmp.WithLogger(d.mg.log), qmp.WithoutSymlink(), qmp.WithCommandTimeout(monitorCommandTimeout))
			dcancel()
			if err == nil {
				d.mon = c
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("new QEMU did not open its monitor within %s", prepareTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// finalize runs the guest here once the source has seen the migration
// complete: the stream must be complete on this side too, then cont.
func (d *incomingVM) finalize(ctx context.Context, m migwire.Msg) error {
	ctx, cancel := context.WithTimeout(ctx, finalizeTimeout)
	defer cancel()
	if err := migwire.AwaitIncoming(ctx, d.mon); err != nil {
		return err
	}
	if err := d.stopExports(ctx); err != nil {
		return err
	}
	// Not in the stream: the disks' I/O limits (links are).
	if err := livesettings.Runtime(ctx, d.mon, &d.f.VM, d.st.Sockets().QMP); err != nil {
		return err
	}
	if !d.local && len(m.Console) > 0 {
		// Before cont: the guest has printed nothing here yet.
		// Through the logger's FIFO: it alone writes the log's files.
		f, err := os.OpenFile(d.st.ConsoleFIFO(), os.O_WRONLY|syscall.O_NOFOLLOW, 0)
		if err == nil {
			_, err = f.Write(m.Console)
			f.Close()
		}
		if err != nil {
			return fmt.Errorf("console log: %w", err)
		}
	}
	if !d.postcopy {
		var err error
		if d.resumed, err = contTimed(ctx, d.mon); err != nil {
			return fmt.Errorf("cont: %w", err)
		}
	}
	qs, err := d.mon.QueryStatus(ctx)
	if err != nil {
		return fmt.Errorf("after cont: query-status: %w", err)
	}
	if !qs.Running {
		return fmt.Errorf("after cont QEMU is %q", qs.Status)
	}
	if d.local {
		d.finalized = true // the guest runs here now: never tear it down
		return nil
	}
	if err := d.commit(); err != nil {
		return err
	}
	d.finalized = true
	if d.autostart { // before the journal ends: its recovery does the same
		if err := d.mg.enableApplied(ctx, d.name); err != nil {
			d.mg.log.Warn("enable autostart after migration", "vm", d.name, "err", err)
		}
	}
	// The guest runs here: keep all of it, end the journal, and let the
	// VM's lock go.
	d.undo = nil
	d.st.Unlock(ctx)
	return nil
}

// Steps of a destination's hand-over, as AfterStep sees them (and, across
// hosts, its journal): each of the new QEMU's sockets takes the VM's usual
// name, then the VM's record names the new QEMU.
const stepHandOverRecord operation.Step = "hand-over record"

// handOverSockets are the sockets a destination QEMU hands over, in order:
// qmp.sock first (recovery asks it which QEMU runs the guest).
func handOverSockets() []string {
	return []string{"qmp.sock", "events.sock", "console.sock", "qga.sock", "vnc.sock"}
}

func handOverStep(sock string) operation.Step { return operation.Step("hand-over " + sock) }

// HandOverSteps are the steps of a migration destination's hand-over (its
// QEMU runs the guest: its sockets take the VM's names, then the record is
// written), in order, as AfterStep sees them.
func HandOverSteps() []string {
	var out []operation.Step
	for _, f := range handOverSockets() {
		out = append(out, handOverStep(f))
	}
	return stepNames(append(out, stepHandOverRecord)...)
}

// handOver renames the sockets still in the incoming directory inDir to
// their usual names in dir; after, if set, sees each as a step (whether it
// was still there or not). A connect() finds a listening socket by its
// inode, so the renamed path reaches the running QEMU.
func handOver(inDir, dir string, after func(step operation.Step)) error {
	for _, f := range handOverSockets() {
		if exists(filepath.Join(inDir, f)) {
			if err := os.Rename(filepath.Join(inDir, f), filepath.Join(dir, f)); err != nil {
				return fmt.Errorf("hand over %s: %w", f, err)
			}
		}
		if after != nil {
			after(handOverStep(f))
		}
	}
	return nil
}

// afterStep reports a step of the hand-over: journaled first on another
// host (the receiver's own journal), then Options.AfterStep sees it.
func (d *incomingVM) afterStep(step operation.Step) {
	if op := d.st.Op(); op != nil {
		op.Step(step)
	} else {
		d.mg.afterStep(d.name, string(step))
	}
}

// commit gives the new QEMU the VM's usual socket names and records it as
// the VM's QEMU. On the same host it runs after the source QEMU is gone.
func (d *incomingVM) commit() error {
	sockDir, unit, app := d.st.Sockets().Dir, d.st.Unit(), d.st.Applied()
	if d.local {
		// The old QEMU is gone: its taps go, the new QEMU's become the
		// VM's. Before the record: recovery does it again from there.
		d.mg.endMove(d.name, true)
	}
	if err := handOver(sockDir, d.p.Dir, d.afterStep); err != nil {
		return err
	}
	// The old QEMU is gone: its forwards' ports are free for this one.
	// Before the record, so a recorded hand-over has them (settleLocal).
	fctx, cancel := context.WithTimeout(context.Background(), quitTimeout)
	_, err := addForwards(fctx, d.mon, &d.f.VM, false)
	cancel()
	if err != nil {
		d.mg.log.Warn("local migration: host forwards not taken over", "vm", d.name, "err", err)
	}
	app.StartedAt = time.Now().UTC()
	if unit != vmstore.UnitName(d.name) {
		app.Unit = unit
	}
	if err := d.mg.env.State().WriteApplied(app, d.f.Raw); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	d.afterStep(stepHandOverRecord)
	os.RemoveAll(sockDir)
	return nil
}

// runPostcopy runs the guest here as soon as the source switched to
// postcopy: its pages arrive on demand, and the source is stopped for good.
func (d *incomingVM) runPostcopy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, finalizeTimeout)
	defer cancel()
	if err := migwire.RunPostcopy(ctx, d.mon); err != nil {
		return err
	}
	d.postcopy = true
	return nil
}
