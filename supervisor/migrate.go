package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	goqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// Live migration, source side. The design (see also migproto.go):
//
//   - Daemonless, like rsync and Proxmox: the source runs the destination's
//     vmsup ("vmsup migrate-receive") through a transport command, ssh by
//     default, and speaks a small versioned protocol over its stdin/stdout.
//     The receiver listens on nothing, so only whoever the transport lets in
//     (ssh keys; root entering a namespace in tests) can drive it.
//   - KubeVirt's split: prepare (the destination starts QEMU from the same
//     spec with -S -incoming defer and listens on a port it picks), migrate
//     (the source's QEMU streams; vmsup watches MIGRATION events and
//     query-migrate), finalize (the destination checks the stream completed
//     and runs cont; only then does the source's QEMU quit).
//   - Any failure before finalize answers tears the destination down and
//     leaves the source running (QEMU resumes a failed or cancelled
//     migration's source itself; vmsup conts it if it is left paused after
//     "completed"). If finalize goes unanswered, the source stays paused:
//     the guest may already run on the destination, and two running copies
//     are worse than a paused one.
//   - On one host (--local) the receiver runs in-process over pipes, the new
//     QEMU runs under the VM's other unit name (altUnit) with its sockets in
//     STATE/incoming, and takes the usual socket names once the old QEMU is
//     gone. state.json records the current unit, so status, down and up
//     follow it.
//   - Disks must be reachable from both sides: the source drops a marker
//     file beside each disk and the destination must see it. Storage
//     migration (drive-mirror to NBD) is not built.

// MigrateOptions configure Migrate. Zero values have documented defaults.
type MigrateOptions struct {
	// To is the destination host (the ssh host, and by default the address
	// its QEMU listens on). Ignored with Local.
	To    string
	Local bool
	// Transport is the command that runs "vmsup migrate-receive" on the
	// destination with the protocol on its stdin/stdout. Default: ssh -o
	// BatchMode=yes TO vmsup migrate-receive.
	Transport []string
	// Address is where the destination QEMU listens for the stream;
	// default To.
	Address string
	// Bandwidth in bytes per second; 0 = QEMU 7.2's default, 128 MiB/s.
	Bandwidth int64
	// Downtime is the longest pause allowed for the final copy; 0 = 300 ms.
	Downtime time.Duration
	// Multifd, when > 0, streams RAM over that many connections.
	Multifd      int
	AutoConverge bool
	// Postcopy switches to postcopy when precopy has not completed after
	// PostcopyAfter (default 10 s): the destination runs the guest at once
	// and fetches missing pages on demand. There is no rollback after the
	// switch: if the stream then breaks, both QEMUs are left as they are
	// (the newest state is split between them) and the error says so.
	Postcopy      bool
	PostcopyAfter time.Duration
	// stopFirst pauses the source's vCPUs before the stream starts (set for
	// TCG guests by Migrate; see tcgStopAndCopy), recorded in stoppedMark.
	stopFirst   bool
	stoppedMark string
	// Timeout bounds the migration stream; when it passes, the migration is
	// cancelled (default 10 min).
	Timeout time.Duration
	// StallTimeout cancels a migration whose transferred bytes have not
	// moved for that long, e.g. a dead network (default 30 s).
	StallTimeout time.Duration
	// Progress, when set, is called every ProgressInterval (default 0.5 s).
	Progress         func(MigrationProgress)
	ProgressInterval time.Duration
	// Stderr receives the transport's stderr (default os.Stderr).
	Stderr io.Writer
	// Dial opens the stream connections to the destination's relay
	// (default net.Dialer; tests dial from inside a network namespace).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// MigrationProgress is one progress report.
type MigrationProgress struct {
	Status           string        `json:"status"`
	Elapsed          time.Duration `json:"elapsed_ns"`
	Transferred      int64         `json:"transferred_bytes"`
	Remaining        int64         `json:"remaining_bytes"`
	Total            int64         `json:"total_bytes"`
	Rate             float64       `json:"rate_bytes_per_s"`
	DirtyRate        int64         `json:"dirty_bytes_per_s"`
	ExpectedDowntime time.Duration `json:"expected_downtime_ns"`
	Iterations       int64         `json:"iterations"`
}

// MigrateResult reports a completed migration.
type MigrateResult struct {
	VM          string        `json:"vm"`
	To          string        `json:"to"`
	Unit        string        `json:"unit,omitempty"` // the unit now running it (local)
	Postcopy    bool          `json:"postcopy,omitempty"`
	TotalTime   time.Duration `json:"total_time_ns"` // QEMU's total-time
	Downtime    time.Duration `json:"downtime_ns"`   // QEMU's downtime
	SetupTime   time.Duration `json:"setup_time_ns"`
	Transferred int64         `json:"transferred_bytes"`
	// Handover is from vmsup seeing "completed" to the destination
	// reporting the guest running (finalize): the guest stays paused
	// meanwhile, on top of QEMU's Downtime, because the destination runs
	// with -S until vmsup says so.
	Handover time.Duration `json:"handover_ns"`
	Wall     time.Duration `json:"wall_ns"` // the whole vmsup migrate, prepare to handover
	// StopAndCopy: the guest's vCPUs were stopped for the whole copy (a TCG
	// guest, see tcgStopAndCopy), so it was paused for about TotalTime, not
	// only Downtime.
	StopAndCopy bool `json:"stop_and_copy,omitempty"`
}

// tcgStopAndCopy: QEMU 7.2's TCG loses guest writes that race with a
// dirty-bitmap sync (a vCPU store through a TLB entry read before the sync
// reset it is never marked dirty), so a live precopy of a TCG guest can
// corrupt it: measured here under load, 1 of 12 and 1 of 6 raw QEMU
// migrations ended in guest kernel oopses or a hung guest, and 0 of 35 with
// the vCPUs stopped first. KVM tracks dirty pages in the kernel and is not
// affected. vmsup therefore copies TCG guests with their vCPUs stopped:
// correct, with a pause as long as the copy.
const tcgStopAndCopy = true

// ErrMigrationCancelled is a migration cancelled by the user (Ctrl-C, or
// CancelMigration from another process).
var ErrMigrationCancelled = errors.New("migration cancelled")

// qemuDefaultBandwidth is QEMU 7.2's max-bandwidth default. vmsup sets
// every parameter on each migration, because QEMU keeps them between
// migrations (a failed throttled attempt would throttle the next one).
const qemuDefaultBandwidth = 128 << 20

// MigrateError is a failed migration; the guest still runs where Running
// says.
type MigrateError struct {
	VM      string
	Step    string
	Running string // "source", "destination", "source (paused)", "none"
	Err     error
}

func (e *MigrateError) Error() string {
	return fmt.Sprintf("vm %q: migrate: %s: %v (the guest runs on: %s)", e.VM, e.Step, e.Err, e.Running)
}
func (e *MigrateError) Unwrap() error { return e.Err }

// Migrate moves the running VM name to another host (o.To) or into a new
// QEMU on this host (o.Local).
func (s *Supervisor) Migrate(ctx context.Context, name string, o MigrateOptions) (res MigrateResult, err error) {
	start := time.Now()
	if err := spec.ValidName(name); err != nil {
		return res, fmt.Errorf("vm %q: %w", name, err)
	}
	if !o.Local && o.To == "" {
		return res, fmt.Errorf("vm %q: migrate: no destination (give a host or local)", name)
	}
	o = o.withDefaults()
	res.VM, res.To = name, o.To
	if o.Local {
		res.To = "local"
	}
	fail := func(step, running string, err error) (MigrateResult, error) {
		return res, &MigrateError{VM: name, Step: step, Running: running, Err: err}
	}
	lu, err := s.lockUnit(ctx, name, "migrate")
	if err != nil {
		return res, err
	}
	defer lu.unlock()
	sd, unit, st := lu.sd, lu.unit, lu.st
	if !st.Exists || st.ActiveState != "active" {
		return res, fmt.Errorf("vm %q: %w", name, ErrNotRunning)
	}
	p := s.paths(name)
	app, err := s.readApplied(name)
	if err != nil {
		return res, fmt.Errorf("vm %q: %w", name, err)
	}
	raw, err := os.ReadFile(p.Spec)
	if err != nil {
		return res, fmt.Errorf("vm %q: %w", name, err)
	}
	f, err := spec.Parse(orDefault(app.SourceFile, p.Spec), raw)
	if err != nil {
		return res, fmt.Errorf("vm %q: applied spec: %w", name, err)
	}
	if len(app.Attached) > 0 || len(app.AttachedNICs) > 0 {
		// The destination QEMU is built from the spec: its devices would not
		// match the source's and QEMU would refuse the stream.
		return res, fmt.Errorf("vm %q: migrate: %d hot-plugged disk(s) and %d NIC(s) are not migrated (the destination starts from the spec file): detach them first",
			name, len(app.Attached), len(app.AttachedNICs))
	}
	if app.Resized != nil {
		return res, fmt.Errorf("vm %q: migrate: its vCPUs or memory were changed live (vmsup set: %d vCPUs, %s); the destination starts from the spec file and could not take them: restart it with the new sizes in its file first",
			name, app.Resized.CPUs, app.Resized.Memory)
	}
	// The event monitor, not qmp.sock: status, console and "migrate
	// --cancel" keep working on the command monitor meanwhile.
	dctx, dcancel := context.WithTimeout(ctx, qmpConnectTimeout)
	mon, err := qmp.Dial(dctx, p.Events, qmp.WithLogger(s.opts.Logger), qmp.WithoutSymlink())
	dcancel()
	if err != nil {
		return res, fmt.Errorf("vm %q: event monitor: %w", name, err)
	}
	defer mon.Close()
	if qs, err := mon.QueryStatus(ctx); err != nil {
		return res, fmt.Errorf("vm %q: query-status: %w", name, err)
	} else if !qs.Running {
		return res, fmt.Errorf("vm %q: QEMU is %q, not running; resume it first", name, qs.Status)
	}

	var markers map[string]string
	if !o.Local {
		var cleanup func()
		markers, cleanup = diskMarkers(name, f)
		defer cleanup()
	}

	peer, closePeer, err := s.openTransport(ctx, o)
	if err != nil {
		return fail("transport", "source", err)
	}
	// Until finalize is answered, any way out tears the destination down.
	finalized := false
	defer func() {
		if !finalized {
			_ = peer.send(migMsg{Type: msgAbort})
		}
		closePeer()
	}()
	if r, err := peer.call(ctx, migMsg{Type: msgHello, Version: migProtoVersion}, msgHello, helloTimeout); err != nil {
		return fail("hello", "source", err)
	} else if r.Version != migProtoVersion {
		return fail("hello", "source", fmt.Errorf("destination speaks protocol version %d, want %d", r.Version, migProtoVersion))
	}
	host, _ := os.Hostname()
	prep := migMsg{
		Type: msgPrepare, Name: name, SourceFile: app.SourceFile, Spec: raw, Accel: app.Accel,
		CPUModel: app.CPUModel, CPUMasks: app.CPUMasks,
		Listen: o.Address, Multifd: o.Multifd, Postcopy: o.Postcopy, Markers: markers,
		From: host, Timeout: o.Timeout,
	}
	if o.Local {
		prep.From = "local"
	} else if prep.Autostart = s.isEnabled(name); f.VM.Boot.Firmware == spec.FirmwareUEFI {
		if prep.UEFIVars, err = os.ReadFile(p.UEFIVars); err != nil {
			return fail("prepare", "source", fmt.Errorf("UEFI variable store: %w", err))
		}
	}
	r, err := peer.call(ctx, prep, msgPrepared, prepareTimeout)
	if err != nil {
		return fail("prepare", "source", err)
	}
	s.opts.Logger.Debug("destination ready", "vm", name, "uri", r.URI)
	if s.opts.AfterStep != nil {
		s.opts.AfterStep(name, "migrate-prepared")
	}

	uri := r.URI
	if !o.Local {
		// The source QEMU streams to a unix socket of vmsup's, which relays
		// each connection to the destination's relay over TCP.
		addr, ok := strings.CutPrefix(r.URI, "tcp:")
		if !ok {
			return fail("prepare", "source", fmt.Errorf("destination gave %q, want tcp:HOST:PORT", r.URI))
		}
		sock := filepath.Join(p.Dir, "migrate-out-"+randHex(6)+".sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			return fail("relay", "source", err)
		}
		if err := chownLike(sock, p.Dir); err != nil {
			ln.Close()
			return fail("relay", "source", err)
		}
		dial := func() (net.Conn, error) {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			c, err := o.Dial(dctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return dialRelayTLS(dctx, c, r.CertPin)
		}
		relay := startRelay(ln, dial, nil, sendToken(r.Token), s.opts.Logger)
		defer func() { relay.Close(); os.Remove(sock) }()
		uri = "unix:" + sock
	}
	o.stopFirst = tcgStopAndCopy && app.Accel == spec.AccelTCG
	o.stoppedMark = p.stoppedByMigration()
	defer os.Remove(o.stoppedMark) // however this migration ends, it ends here
	res.StopAndCopy = o.stopFirst
	onPostcopy := func() error {
		_, err := peer.call(context.WithoutCancel(ctx), migMsg{Type: msgRun}, msgRunning, finalizeTimeout)
		return err
	}
	info, postcopy, err := s.stream(ctx, mon, uri, o, start, onPostcopy)
	res.Postcopy = postcopy
	if err != nil {
		running := "source"
		if mon.Err() != nil {
			running = "none (the source's QEMU died; the destination was torn down)"
		} else if postcopy {
			running = "none (failed during postcopy)"
		} else if rerr := s.resumeSource(mon); rerr != nil {
			running = "none? (" + rerr.Error() + ")"
		}
		return fail("stream", running, err)
	}
	res.TotalTime = time.Duration(info.TotalTime) * time.Millisecond
	res.Downtime = time.Duration(info.Downtime) * time.Millisecond
	res.SetupTime = time.Duration(info.SetupTime) * time.Millisecond
	if info.RAM != nil {
		res.Transferred = info.RAM.Transferred
	}
	if s.opts.AfterStep != nil {
		s.opts.AfterStep(name, "migrate-completed")
	}

	handoverStart := time.Now()
	fin := migMsg{Type: msgFinalize}
	if !o.Local {
		fin.Console = consoleTail(p.ConsoleLog, 4<<20)
	}
	if _, err := peer.call(ctx, fin, msgFinalized, finalizeTimeout); err != nil {
		var re *RemoteError
		if errors.As(err, &re) {
			// The destination said no and tears itself down: run here.
			if rerr := s.resumeSource(mon); rerr != nil {
				return fail("finalize", "none? ("+rerr.Error()+")", err)
			}
			return fail("finalize", "source", err)
		}
		// No answer: the destination may be running the guest. Stay paused.
		finalized = true
		return fail("finalize", "source (paused; check the destination before resuming it here)", err)
	}
	finalized = true
	res.Handover = time.Since(handoverStart)
	// The guest runs on the destination; this QEMU holds a stale copy.
	qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer qcancel()
	if o.Local {
		// The old unit's stop-post hook must leave the VM's network and
		// grants to the new QEMU (see StopPost).
		_ = os.WriteFile(p.handover(), nil, 0o600)
		defer os.Remove(p.handover())
	}
	_ = mon.Quit(qctx)
	if err := waitUnitGone(qctx, sd, unit); err != nil {
		_ = sd.Kill(qctx, unit, syscall.SIGKILL)
		_ = waitUnitGone(qctx, sd, unit)
	}
	if o.Local {
		if _, err := peer.call(qctx, migMsg{Type: msgCommit}, msgCommitted, finalizeTimeout); err != nil {
			return fail("commit", "destination (new QEMU; sockets not handed over)", err)
		}
		res.Unit = s.unitOf(name)
	} else {
		// The VM now belongs to the destination: nothing of it stays here.
		if err := s.afterStop(qctx, name); err != nil {
			s.opts.Logger.Warn("clean-up after migration", "vm", name, "err", err)
		}
		if err := p.removeAll(); err != nil {
			s.opts.Logger.Warn("remove state after migration", "vm", name, "err", err)
		}
		if prep.Autostart { // the destination enabled it: a reboot here must not start a copy
			if err := s.Disable(qctx, name); err != nil {
				s.opts.Logger.Warn("disable autostart after migration", "vm", name, "err", err)
			}
		}
	}
	res.Wall = time.Since(start)
	return res, nil
}

func (o MigrateOptions) withDefaults() MigrateOptions {
	if o.Address == "" {
		o.Address = o.To
	}
	if len(o.Transport) == 0 && !o.Local {
		o.Transport = []string{"ssh", "-o", "BatchMode=yes", o.To, "vmsup", "migrate-receive"}
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 30 * time.Second
	}
	if o.PostcopyAfter <= 0 {
		o.PostcopyAfter = 10 * time.Second
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 500 * time.Millisecond
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Dial == nil {
		o.Dial = defaultDial
	}
	return o
}

// openTransport starts the receiver: in-process for a local migration, else
// the transport command. closePeer ends it and waits (bounded) for it.
func (s *Supervisor) openTransport(ctx context.Context, o MigrateOptions) (*migPeer, func(), error) {
	if o.Local {
		reqR, reqW := io.Pipe()
		repR, repW := io.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Not ctx: a Ctrl-C must reach the destination as an abort
			// after migrate_cancel, not kill it mid-way.
			if err := s.receive(context.WithoutCancel(ctx), newMigPeer(reqR, repW), true); err != nil {
				s.opts.Logger.Debug("local receiver", "err", err)
			}
			repW.Close()
			reqR.Close()
		}()
		return newMigPeer(repR, reqW), func() {
			reqW.Close()
			select {
			case <-done:
			case <-time.After(receiverExit):
			}
		}, nil
	}
	cmd := exec.Command(o.Transport[0], o.Transport[1:]...)
	cmd.Stderr = o.Stderr
	// Own process group: a Ctrl-C on the terminal reaches vmsup, which
	// cancels in order, not the transport.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	// An os.Pipe rather than StdoutPipe: Wait closes StdoutPipe's read end
	// as soon as the receiver exits, which can be before its last reply
	// ("finalized") has been read.
	stdout, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout = pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		stdout.Close()
		return nil, nil, fmt.Errorf("%s: %w", strings.Join(o.Transport, " "), err)
	}
	exited := make(chan struct{})
	peer := newMigPeer(stdout, stdin)
	go func() { cmd.Wait(); close(exited) }()
	return peer, func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(receiverExit):
			_ = cmd.Process.Kill()
			<-exited
		}
		stdout.Close()
	}, nil
}

// stream runs the migration on the source's QEMU until it completes, fails,
// is cancelled, stalls or times out, and returns the final figures.
func (s *Supervisor) stream(ctx context.Context, mon *qmp.Conn, uri string, o MigrateOptions, start time.Time, onPostcopy func() error) (qmp.MigrationInfo, bool, error) {
	bw := o.Bandwidth
	if bw <= 0 {
		bw = qemuDefaultBandwidth
	}
	dt := int64(300)
	if o.Downtime > 0 {
		dt = o.Downtime.Milliseconds()
	}
	params := qmp.MigrationParameters{MaxBandwidth: &bw, DowntimeLimit: &dt}
	if o.Multifd > 0 {
		n := int64(o.Multifd)
		params.MultifdChannels = &n
	}
	caps := []qmp.MigrationCapability{
		{Capability: "events", State: true},
		{Capability: "multifd", State: o.Multifd > 0},
		{Capability: "postcopy-ram", State: o.Postcopy},
		{Capability: "auto-converge", State: o.AutoConverge},
	}
	if err := mon.MigrateSetCapabilities(ctx, caps); err != nil {
		return qmp.MigrationInfo{}, false, fmt.Errorf("capabilities: %w", err)
	}
	if err := mon.MigrateSetParameters(ctx, params); err != nil {
		return qmp.MigrationInfo{}, false, fmt.Errorf("parameters: %w", err)
	}
	sub, unsub := mon.Subscribe(context.WithoutCancel(ctx))
	defer unsub()
	if o.stopFirst {
		// Recorded before the stop: if this vmsup dies mid-stream, the
		// next command on the VM resumes a source whose migration failed
		// (recoverStoppedSource); QEMU itself resumes only a source that
		// was running when the migration began.
		if err := os.WriteFile(o.stoppedMark, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
			return qmp.MigrationInfo{}, false, fmt.Errorf("record the paused source: %w", err)
		}
		if err := mon.Stop(ctx); err != nil {
			os.Remove(o.stoppedMark)
			return qmp.MigrationInfo{}, false, fmt.Errorf("stop the source's vCPUs: %w", err)
		}
	}
	if err := mon.Migrate(ctx, uri); err != nil {
		return qmp.MigrationInfo{}, false, fmt.Errorf("migrate %s: %w", uri, err)
	}
	tick := time.NewTicker(o.ProgressInterval)
	defer tick.Stop()
	deadline := time.NewTimer(o.Timeout)
	defer deadline.Stop()
	var pcTimer <-chan time.Time
	if o.Postcopy {
		t := time.NewTimer(o.PostcopyAfter)
		defer t.Stop()
		pcTimer = t.C
	}
	postcopy := false
	lastBytes, lastMove := int64(-1), time.Now()
	var cancelWhy error
	bg := context.WithoutCancel(ctx)
	done := ctx.Done() // nil once seen: in postcopy there is nothing to cancel
	for cancelWhy == nil {
		var status string
		select {
		case ev, ok := <-sub:
			if !ok {
				return qmp.MigrationInfo{}, postcopy, fmt.Errorf("source QEMU went away: %w", mon.Err())
			}
			status = migrationStatus(ev)
		case <-tick.C:
			qctx, cancel := context.WithTimeout(bg, 5*time.Second)
			info, err := mon.QueryMigrate(qctx)
			cancel()
			if err != nil {
				return info, postcopy, fmt.Errorf("query-migrate: %w", err)
			}
			status = info.Status
			if info.RAM != nil {
				if info.RAM.Transferred != lastBytes {
					lastBytes, lastMove = info.RAM.Transferred, time.Now()
				} else if time.Since(lastMove) > o.StallTimeout && !postcopy {
					cancelWhy = fmt.Errorf("no progress for %s (network down?)", o.StallTimeout)
				}
			}
			if o.Progress != nil {
				o.Progress(progressOf(info, time.Since(start)))
			}
		case <-pcTimer:
			if err := mon.MigrateStartPostcopy(bg); err != nil {
				s.opts.Logger.Warn("migrate-start-postcopy", "err", err)
			}
			continue
		case <-deadline.C:
			if !postcopy {
				cancelWhy = fmt.Errorf("did not converge within %s", o.Timeout)
			}
			continue
		case <-done:
			done = nil
			if !postcopy {
				cancelWhy = ErrMigrationCancelled
			}
			continue
		}
		switch status {
		case "completed":
			return finalInfo(bg, mon), postcopy, nil
		case "failed":
			info, _ := mon.QueryMigrate(bg)
			return info, postcopy, fmt.Errorf("migration failed: %s", orDefault(info.ErrorDesc, "QEMU gave no reason"))
		case "cancelled":
			return qmp.MigrationInfo{}, postcopy, ErrMigrationCancelled
		case "postcopy-active":
			if !postcopy {
				postcopy = true
				// The source is stopped for good: run the guest on the
				// destination now, its missing pages come on demand.
				if err := onPostcopy(); err != nil {
					return qmp.MigrationInfo{}, postcopy, fmt.Errorf("postcopy: start the destination: %w", err)
				}
			}
		}
	}
	// Cancel, and wait for QEMU to say it stopped (it may also complete in
	// the meantime: the destination is still torn down, the source resumed).
	cctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	if err := mon.MigrateCancel(cctx); err != nil {
		return qmp.MigrationInfo{}, postcopy, fmt.Errorf("%w; migrate_cancel: %v", cancelWhy, err)
	}
	for {
		info, err := mon.QueryMigrate(cctx)
		if err != nil {
			return info, postcopy, fmt.Errorf("%w; after migrate_cancel: %v", cancelWhy, err)
		}
		switch info.Status {
		case "cancelled", "failed", "completed":
			return info, postcopy, cancelWhy
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func migrationStatus(ev goqmp.Event) string {
	if ev.Event != "MIGRATION" {
		return ""
	}
	st, _ := ev.Data["status"].(string)
	return st
}

// finalInfo reads the figures of a completed migration; right after
// "completed" QEMU may still report total-time 0.
func finalInfo(ctx context.Context, mon *qmp.Conn) qmp.MigrationInfo {
	var info qmp.MigrationInfo
	for i := 0; i < 20; i++ {
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var err error
		info, err = mon.QueryMigrate(qctx)
		cancel()
		if err == nil && info.TotalTime > 0 {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	return info
}

func progressOf(info qmp.MigrationInfo, elapsed time.Duration) MigrationProgress {
	p := MigrationProgress{Status: info.Status, Elapsed: elapsed, ExpectedDowntime: time.Duration(info.ExpectedDowntime) * time.Millisecond}
	if r := info.RAM; r != nil {
		p.Transferred, p.Remaining, p.Total = r.Transferred, r.Remaining, r.Total
		p.Rate = r.Mbps * 1e6 / 8
		ps := r.PageSize
		if ps == 0 {
			ps = 4096
		}
		p.DirtyRate = r.DirtyPagesRate * ps
		p.Iterations = r.DirtySyncCount
	}
	return p
}

// resumeSource makes sure the source's guest runs after a failed attempt.
// QEMU resumes it after a failed or cancelled migration; after "completed"
// it stays paused ("postmigrate") until cont.
func (s *Supervisor) resumeSource(mon *qmp.Conn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		qs, err := mon.QueryStatus(ctx)
		if err != nil {
			return fmt.Errorf("source QEMU: %w", err)
		}
		switch qs.Status {
		case "running":
			return nil
		case "postmigrate", "paused":
			if err := mon.Cont(ctx); err != nil {
				return fmt.Errorf("cont the source: %w", err)
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("source QEMU is %q", qs.Status)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// diskMarkers creates a marker file beside each disk so the destination can
// prove it sees the same directory (shared storage). Disks in directories
// vmsup cannot write get no marker; the destination then only checks that
// the file exists.
func diskMarkers(name string, f *spec.File) (map[string]string, func()) {
	m := map[string]string{}
	var made []string
	for _, d := range f.VM.Disks {
		if d.File == "" || !filepath.IsAbs(d.File) {
			continue // network storage (RBD, iSCSI) is shared by nature
		}
		if st, err := os.Stat(d.File); err != nil || !st.Mode().IsRegular() {
			continue // a block device path: its directory says nothing
		}
		mk := filepath.Join(filepath.Dir(d.File), ".vmsup-migrate-"+name+"-"+randHex(8))
		if err := os.WriteFile(mk, nil, 0o600); err != nil {
			continue
		}
		m[d.File] = mk
		made = append(made, mk)
	}
	return m, func() {
		for _, mk := range made {
			os.Remove(mk)
		}
	}
}

// consoleTail returns up to max bytes of the end of the console log.
func consoleTail(path string, max int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := int64(0)
	if st.Size() > max {
		off = st.Size() - max
	}
	b := make([]byte, st.Size()-off)
	n, _ := f.ReadAt(b, off)
	return b[:n]
}

// CancelMigration cancels the VM's outgoing migration (QMP migrate_cancel);
// the vmsup migrating it then tears the destination down and the guest
// keeps running here.
func (s *Supervisor) CancelMigration(ctx context.Context, name string) error {
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		return err
	}
	defer release()
	info, err := c.QueryMigrate(ctx)
	if err != nil {
		return fmt.Errorf("vm %q: %w", name, err)
	}
	switch info.Status {
	case "setup", "active", "pre-switchover", "device", "wait-unplug":
	case "postcopy-active":
		return fmt.Errorf("vm %q: the migration is in postcopy: the guest already runs on the destination, it cannot be cancelled", name)
	default:
		return fmt.Errorf("vm %q: no migration in progress (status %q)", name, orDefault(info.Status, "none"))
	}
	if err := c.MigrateCancel(ctx); err != nil {
		return fmt.Errorf("vm %q: migrate_cancel: %w", name, err)
	}
	return nil
}

// chownLike gives path the owner of ref (QEMU may run as the state
// directory's owner rather than root).
func chownLike(path, ref string) error {
	fi, err := os.Stat(ref)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return os.Lchown(path, int(st.Uid), int(st.Gid))
}

// handover marks a local migration's handover: the old QEMU is quitting
// and a new one already runs the guest with the same host resources.
func (p vmPaths) handover() string { return filepath.Join(p.Records, "handover") }

// stoppedByMigration marks a source whose vCPUs vmsup stopped for a
// stop-and-copy migration (TCG), until that migration has ended.
func (p vmPaths) stoppedByMigration() string { return filepath.Join(p.Records, "stopped-by-migration") }

// recoverStoppedSource resumes a source that a stop-and-copy migration left
// paused when its vmsup died: the mark is there, no vmsup holds the VM's
// lock any more, and QEMU says the migration failed or was cancelled. A
// completed one is left paused: the guest may run on the destination.
// locked says the caller holds the VM's lock.
func (s *Supervisor) recoverStoppedSource(ctx context.Context, name string, c *qmp.Conn, locked bool) (bool, error) {
	p := s.paths(name)
	if _, err := os.Stat(p.stoppedByMigration()); err != nil {
		return false, nil
	}
	if !locked {
		lk, err := s.tryLock(ctx, name, "recover")
		if err != nil || lk == nil {
			return false, err // the migration is still going
		}
		defer lk.unlock()
	}
	info, err := c.QueryMigrate(ctx)
	if err != nil {
		return false, err
	}
	switch info.Status {
	case "completed", "postcopy-active", "postcopy-paused", "postcopy-recover":
		return false, nil
	case "failed", "cancelled", "":
	default:
		return false, nil // still active: a QEMU whose vmsup died mid-stream fails it soon
	}
	if err := c.Cont(ctx); err != nil {
		return false, fmt.Errorf("resume the source after its migration %s: %w", orDefault(info.Status, "ended"), err)
	}
	os.Remove(p.stoppedByMigration())
	s.opts.Logger.Warn("resumed a source left paused by a migration whose vmsup died", "vm", name, "migration", info.Status)
	return true, nil
}
