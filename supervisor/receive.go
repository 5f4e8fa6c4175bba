package supervisor

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Timeouts of the migration protocol's steps (the migration itself is
// bounded by MigrateOptions.Timeout).
const (
	helloTimeout    = 30 * time.Second
	prepareTimeout  = 90 * time.Second // QEMU start under a loaded TCG host
	finalizeTimeout = 60 * time.Second
	receiverExit    = 30 * time.Second
)

// errAborted is the source's abort (or its vanishing) before finalize.
var errAborted = errors.New("migration aborted by the source; destination torn down")

// Receive serves one incoming migration over r (the source's requests) and
// w (replies): it is "vmsup migrate-receive", run by the source through its
// transport. Everything it sets up is torn down again unless the source
// finalizes; the guest then runs here and the VM's state lives under this
// host's Root.
func (s *Supervisor) Receive(ctx context.Context, r io.Reader, w io.Writer) error {
	return s.receive(ctx, newMigPeer(r, w), false)
}

func (s *Supervisor) receive(ctx context.Context, peer *migPeer, local bool) error {
	m, err := peer.recv(ctx, helloTimeout)
	if err != nil {
		return fmt.Errorf("migrate-receive: hello: %w", err)
	}
	if m.Type != msgHello || m.Version != migProtoVersion {
		_ = peer.send(migMsg{Type: msgError, Error: fmt.Sprintf("this vmsup speaks migration protocol version %d, got %q version %d", migProtoVersion, m.Type, m.Version)})
		return fmt.Errorf("migrate-receive: protocol version %d not supported (want %d)", m.Version, migProtoVersion)
	}
	host, _ := os.Hostname()
	if err := peer.send(migMsg{Type: msgHello, Version: migProtoVersion, Host: host}); err != nil {
		return err
	}
	m, err = peer.recv(ctx, helloTimeout)
	if err != nil || m.Type == msgAbort {
		return errAborted
	}
	if m.Type != msgPrepare {
		return fmt.Errorf("migrate-receive: want prepare, got %q", m.Type)
	}
	m.Local = local
	d := &incomingVM{s: s, local: local, autostart: m.Autostart && !local}
	defer func() {
		if !d.finalized {
			d.teardown(ctx)
		}
		if d.relay != nil {
			d.relay.Close() // idempotent; after finalize the stream is done
		}
		if d.mon != nil {
			d.mon.Close()
		}
	}()
	uri, err := d.prepare(ctx, m)
	if err != nil {
		err = fmt.Errorf("vm %q: %w", m.Name, err)
		_ = peer.send(migMsg{Type: msgError, Error: err.Error()})
		return err
	}
	if err := peer.send(migMsg{Type: msgPrepared, URI: uri, Token: d.token, CertPin: d.certPin}); err != nil {
		return err
	}
	// The migration runs between the QEMUs now; the source bounds it with
	// its timeout and then finalizes or aborts.
	for {
		m, err = peer.recv(ctx, d.wait)
		if err == nil && m.Type == msgRun {
			if err := d.runPostcopy(ctx); err != nil {
				_ = peer.send(migMsg{Type: msgError, Error: err.Error()})
				return err
			}
			if err := peer.send(migMsg{Type: msgRunning}); err != nil {
				return err
			}
			continue
		}
		break
	}
	if err != nil || m.Type != msgFinalize {
		if d.postcopy {
			// The newest guest state is here and nowhere else: keep it
			// for the operator (QEMU's postcopy recovery), do not kill it.
			d.finalized = true
			return fmt.Errorf("vm %q: source went away during postcopy; the destination QEMU (%s) is left as it is", d.name, d.unit)
		}
		return errAborted
	}
	if err := d.finalize(ctx, m); err != nil {
		err = fmt.Errorf("vm %q: %w", d.name, err)
		_ = peer.send(migMsg{Type: msgError, Error: err.Error()})
		return err
	}
	if d.autostart {
		if err := s.enableApplied(ctx, d.name); err != nil {
			s.opts.Logger.Warn("enable autostart after migration", "vm", d.name, "err", err)
		}
	}
	if err := peer.send(migMsg{Type: msgFinalized}); err != nil {
		return err
	}
	if !local {
		return nil
	}
	// Local: the source's QEMU quits, then its sockets' names become ours.
	m, err = peer.recv(ctx, finalizeTimeout)
	if err == nil && m.Type != msgCommit {
		err = fmt.Errorf("got %q", m.Type)
	}
	if err != nil {
		return fmt.Errorf("vm %q: source did not hand over (%v); the new QEMU runs as %s", d.name, err, d.unit)
	}
	if err := d.commit(); err != nil {
		_ = peer.send(migMsg{Type: msgError, Error: err.Error()})
		return err
	}
	return peer.send(migMsg{Type: msgCommitted})
}

// incomingVM is the destination side of one migration: a QEMU started with
// -incoming under its own unit, its sockets in p.Dir/incoming until it takes
// over, and the undo list that removes all of it.
type incomingVM struct {
	s         *Supervisor
	local     bool
	name      string
	unit      string
	f         *spec.File
	app       *applied
	p, in     vmPaths // the VM's usual paths; the incoming QEMU's sockets
	sd        *units.Manager
	mon       *qmp.Conn // the destination QEMU's event monitor
	undo      []func(context.Context)
	finalized bool
	autostart bool      // enable for boot here once running (cross-host)
	postcopy  bool      // the guest already runs here (postcopy)
	relay     *migRelay // cross-host: TCP -> QEMU's unix socket
	token     string
	certPin   string        // the relay's TLS certificate, for the source to pin
	wait      time.Duration // how long to wait for finalize
}

func (d *incomingVM) teardown(ctx context.Context) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	for i := len(d.undo) - 1; i >= 0; i-- {
		d.undo[i](uctx)
	}
	d.undo = nil
}

// altUnit is the unit a local migration's new QEMU runs under: the other of
// the VM's two names. A unit name cannot change while its process lives, so
// the VM alternates between vmsup-NAME.service and vmsup-NAME@migrated.service
// and state.json records which one is current (Supervisor.unitOf).
func altUnit(name, cur string) string {
	if cur == units.Name(name) {
		return "vmsup-" + name + "@migrated.service"
	}
	return units.Name(name)
}

func (d *incomingVM) prepare(ctx context.Context, m migMsg) (string, error) {
	s := d.s
	if err := spec.ValidName(m.Name); err != nil {
		return "", err
	}
	d.name, d.p = m.Name, s.paths(m.Name)
	d.wait = 24 * time.Hour
	if m.Timeout > 0 {
		d.wait = m.Timeout + 2*time.Minute
	}
	f, err := spec.Parse(orDefault(m.SourceFile, d.p.Spec), m.Spec)
	if err != nil {
		return "", fmt.Errorf("spec from the source: %w", err)
	}
	if f.VM.Name != m.Name {
		return "", fmt.Errorf("spec names VM %q", f.VM.Name)
	}
	d.f = f
	if d.sd, err = s.systemd(ctx); err != nil {
		return "", err
	}
	if d.local {
		d.unit = altUnit(d.name, s.unitOf(d.name))
	} else {
		lk, err := s.lock(ctx, d.name, "migrate-receive")
		if err != nil {
			return "", err
		}
		d.undo = append(d.undo, func(context.Context) { lk.unlock() })
		d.unit = units.Name(d.name)
		if cur := s.unitOf(d.name); cur != d.unit {
			if st, err := d.sd.Status(ctx, cur); err == nil && st.Exists && st.ActiveState != "inactive" && st.ActiveState != "failed" {
				return "", fmt.Errorf("already running on this host as %s", cur)
			}
		}
		h := s.hostFacts()
		if m.Accel == spec.AccelKVM && !h.KVMOpenable {
			return "", fmt.Errorf("the source runs it under kvm but here %s", h.KVMUnusable)
		}
		if err := checkHost(f, h, s.opts.QEMU); err != nil {
			return "", err
		}
		for i, disk := range f.VM.Disks {
			mk, ok := m.Markers[disk.File]
			if !ok {
				continue // the source could not mark it; it exists here (checkHost)
			}
			if _, err := os.Stat(mk); err != nil {
				return "", fmt.Errorf("disk[%d] %s: not on storage shared with the source (its marker %s is not visible here); "+
					"migrating local-only disks needs storage migration, which vmsup does not do", i, disk.File, mk)
			}
		}
	}
	st, err := d.sd.Status(ctx, d.unit)
	if err != nil {
		return "", err
	}
	switch {
	case st.Exists && st.ActiveState == "failed":
		if err := d.sd.ResetFailed(ctx, d.unit); err != nil {
			return "", err
		}
	case st.Exists && st.ActiveState != "inactive":
		return "", fmt.Errorf("unit %s is %s on this host", d.unit, st.ActiveState)
	}

	// State directory: a new one is removed again on failure; an old one
	// (the VM ran here before) gets its files back.
	if !d.local {
		_, err := os.Stat(d.p.Dir)
		prevDir := err == nil
		prevApp, _ := os.ReadFile(d.p.State)
		prevRaw, _ := os.ReadFile(d.p.Spec)
		if err := os.MkdirAll(d.p.Dir, 0o700); err != nil {
			return "", err
		}
		d.undo = append(d.undo, func(context.Context) {
			if !prevDir {
				d.p.removeAll()
				return
			}
			restoreFile(d.p.State, prevApp)
			restoreFile(d.p.Spec, prevRaw)
		})
		if err := d.p.removeSockets(); err != nil {
			return "", err
		}
		if f.VM.Boot.Firmware == spec.FirmwareUEFI {
			// The flash contents also travel in the stream (pflash is
			// RAM-backed); the file is what later writes go to.
			if err := os.WriteFile(d.p.UEFIVars, m.UEFIVars, 0o600); err != nil {
				return "", fmt.Errorf("UEFI variable store: %w", err)
			}
		}
		// The source's console history replaces this host's old one.
		if err := os.WriteFile(d.p.ConsoleLog, nil, 0o600); err != nil {
			return "", err
		}
	}
	// What QEMU needs on this host. On the same host the source's are
	// reused as they are.
	plan := &startPlan{}
	if !d.local {
		for _, hs := range s.hostSteps(f, d.p, plan) {
			if err := hs.do(ctx); err != nil {
				return "", fmt.Errorf("%s: %w", hs.name, err)
			}
			if hs.undo != nil {
				d.undo = append(d.undo, hs.undo)
			}
		}
	}
	// A fresh directory each time: a QEMU unlinks the socket paths it bound
	// when it exits, and the previous destination (the source now) bound
	// its sockets under an incoming directory too.
	inDir := filepath.Join(d.p.Dir, "incoming-"+randHex(6))
	d.in = vmPaths{
		Dir: inDir, QMP: filepath.Join(inDir, "qmp.sock"), Events: filepath.Join(inDir, "events.sock"),
		Console: filepath.Join(inDir, "console.sock"), Agent: filepath.Join(inDir, "qga.sock"),
	}
	if err := os.RemoveAll(inDir); err != nil {
		return "", err
	}
	if err := os.Mkdir(inDir, 0o700); err != nil {
		return "", err
	}
	d.undo = append(d.undo, func(context.Context) { os.RemoveAll(inDir) })

	opts := append(plan.argvOpts, func(o *qemuargs.Options) {
		o.Incoming = true
		o.QMPSocket, o.EventSocket, o.ConsoleSocket, o.AgentSocket = d.in.QMP, d.in.Events, d.in.Console, d.in.Agent
		o.ConsoleLog = d.p.ConsoleLog
	})
	cpu := cpuChoice{m.CPUModel, m.CPUMasks}
	if err := s.checkIncomingCPU(m.Accel, f.VM.CPUModel, cpu); err != nil {
		return "", err
	}
	argv, err := s.argv(f, m.Accel, cpu, opts...)
	if err != nil {
		return "", err
	}
	d.app = &applied{Name: d.name, SourceFile: m.SourceFile, Spec: canonical(&f.VM), Accel: m.Accel, Argv: argv, MigratedFrom: m.From,
		CPUModel: cpu.Model, CPUMasks: cpu.Masks}
	d.app.recordBootDisks(&f.VM, nil) // the spare root ports, as up records them
	// QEMU binds its sockets there: same owner as the state directory (the
	// host steps may have given that to an unprivileged QEMU user).
	if err := chownLike(inDir, d.p.Dir); err != nil {
		return "", err
	}
	u := s.unitFor(f, argv, m.Accel)
	u.Name = d.unit
	for _, o := range plan.unitOpts {
		o(&u)
	}
	if d.local {
		// The host steps are not run again on the same host: give the new
		// unit the old one's confinement (user, sandbox, profile) and
		// network hooks from what those steps recorded.
		if c, err := s.readConfinement(d.name); err == nil && c != nil {
			s.sandboxUnit(&u, f, d.p, c)
		}
		netPlan := &startPlan{}
		_ = s.networkSteps(f, d.p, netPlan) // only for its unit options
		for _, o := range netPlan.unitOpts {
			o(&u)
		}
	}
	// The undo goes first: a failed start leaves a failed unit to reset.
	d.undo = append(d.undo, func(ctx context.Context) {
		_ = d.sd.Kill(ctx, d.unit, 9)
		waitGone(ctx, d.sd, d.unit)
		_ = d.sd.ResetFailed(ctx, d.unit)
	})
	if err := d.sd.Start(ctx, u); err != nil {
		return "", fmt.Errorf("start %s: %w: %s", d.unit, err, s.lastWords(ctx, d.unit))
	}
	if err := d.dialMonitor(ctx); err != nil {
		return "", err
	}
	if qs, err := d.mon.QueryStatus(ctx); err != nil {
		return "", fmt.Errorf("new QEMU: query-status: %w", err)
	} else if qs.Status != "inmigrate" {
		return "", fmt.Errorf("new QEMU is %q, not waiting for a migration", qs.Status)
	}
	if err := d.mon.MigrateSetCapabilities(ctx, migrationCaps(m.Multifd, m.Postcopy, false)); err != nil {
		return "", fmt.Errorf("migration capabilities: %w", err)
	}
	if m.Multifd > 0 {
		n := int64(m.Multifd)
		if err := d.mon.MigrateSetParameters(ctx, qmp.MigrationParameters{MultifdChannels: &n}); err != nil {
			return "", fmt.Errorf("multifd channels: %w", err)
		}
	}
	// QEMU listens on a unix socket; across hosts vmsup relays TCP to it
	// (migrelay.go), so QEMU itself needs no network.
	sock := filepath.Join(inDir, "migrate.sock")
	uri := "unix:" + sock
	if err := d.mon.MigrateIncoming(ctx, uri); err != nil {
		return "", fmt.Errorf("listen for the migration on %s: %w", uri, err)
	}
	if d.local {
		return uri, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(m.Listen, "0"))
	if err != nil {
		return "", fmt.Errorf("listen for the migration stream: %w", err)
	}
	rt, err := newRelayTLS()
	if err != nil {
		ln.Close()
		return "", fmt.Errorf("relay certificate: %w", err)
	}
	d.token, d.certPin = newRelayToken(), rt.pin
	relay := startRelay(rt.listen(ln), func() (net.Conn, error) { return qmp.DialSocket(context.Background(), sock) }, checkToken(d.token), nil, s.opts.Logger)
	d.relay = relay
	d.undo = append(d.undo, func(context.Context) { relay.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return "tcp:" + net.JoinHostPort(m.Listen, port), nil
}

// checkIncomingCPU: the destination runs the guest with the source's CPU
// model and masks (the guest must see the same CPU); this host's KVM must
// start that model with those masks.
func (s *Supervisor) checkIncomingCPU(accel spec.Accel, specModel string, cpu cpuChoice) error {
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

// dialMonitor waits for the new QEMU's event monitor (or its unit failing).
func (d *incomingVM) dialMonitor(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	for {
		st, err := d.sd.Status(ctx, d.unit)
		if err != nil {
			return err
		}
		if !st.Exists || st.ActiveState == "failed" || st.ActiveState == "inactive" {
			return fmt.Errorf("QEMU exited (%s): %s", orDefault(st.ExitReason(), st.ActiveState), d.s.lastWords(ctx, d.unit))
		}
		if _, err := os.Stat(d.in.Events); err == nil {
			dctx, dcancel := context.WithTimeout(ctx, qmpConnectTimeout)
			c, err := qmp.Dial(dctx, d.in.Events, qmp.WithLogger(d.s.opts.Logger), qmp.WithoutSymlink())
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
func (d *incomingVM) finalize(ctx context.Context, m migMsg) error {
	ctx, cancel := context.WithTimeout(ctx, finalizeTimeout)
	defer cancel()
	for {
		info, err := d.mon.QueryMigrate(ctx)
		if err != nil {
			return fmt.Errorf("incoming migration: %w", err)
		}
		if info.Status == "completed" {
			break
		}
		if info.Status == "failed" || info.Status == "cancelled" {
			return fmt.Errorf("incoming migration %s: %s", info.Status, info.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("incoming migration still %q", info.Status)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !d.local && len(m.Console) > 0 {
		// Before cont: the guest has printed nothing here yet.
		f, err := os.OpenFile(d.p.ConsoleLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			_, err = f.Write(m.Console)
			f.Close()
		}
		if err != nil {
			return fmt.Errorf("console log: %w", err)
		}
	}
	if !d.postcopy {
		if err := d.mon.Cont(ctx); err != nil {
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
	d.teardownLockOnly()
	return nil
}

// teardownLockOnly releases the VM lock (the first undo on a remote
// destination) and forgets the rest of the undo list.
func (d *incomingVM) teardownLockOnly() {
	if !d.local && len(d.undo) > 0 {
		d.undo[0](context.Background())
	}
	d.undo = nil
}

// commit gives the new QEMU the VM's usual socket names and records it as
// the VM's QEMU. On the same host it runs after the source QEMU is gone.
func (d *incomingVM) commit() error {
	for _, pair := range [][2]string{{d.in.QMP, d.p.QMP}, {d.in.Events, d.p.Events}, {d.in.Console, d.p.Console}, {d.in.Agent, d.p.Agent}} {
		if _, err := os.Stat(pair[0]); err != nil {
			continue
		}
		// A connect() finds a listening socket by its inode, so the renamed
		// path reaches the running QEMU.
		if err := os.Rename(pair[0], pair[1]); err != nil {
			return fmt.Errorf("hand over %s: %w", filepath.Base(pair[1]), err)
		}
	}
	d.app.StartedAt = time.Now().UTC()
	if d.unit != units.Name(d.name) {
		d.app.Unit = d.unit
	}
	if err := d.s.writeApplied(d.app, d.f.Raw); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	os.RemoveAll(d.in.Dir)
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// runPostcopy runs the guest here as soon as the source switched to
// postcopy: its pages arrive on demand, and the source is stopped for good.
func (d *incomingVM) runPostcopy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, finalizeTimeout)
	defer cancel()
	for {
		qs, err := d.mon.QueryStatus(ctx)
		if err != nil {
			return fmt.Errorf("postcopy: %w", err)
		}
		if qs.Running {
			d.postcopy = true
			return nil
		}
		if qs.Status != "inmigrate" {
			if err := d.mon.Cont(ctx); err != nil {
				return fmt.Errorf("postcopy: cont: %w", err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postcopy: destination still %q", qs.Status)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
