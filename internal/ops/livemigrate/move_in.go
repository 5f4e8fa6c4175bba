package livemigrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// The destination of a move of a shut-off VM (vmsup move; the source:
// move_out.go). Under the VM's lock and its own journal it makes each disk
// the source offers and this host does not see, as a migration destination
// does (planCopies), exports them over a qemu-storage-daemon's NBD server
// through the stream's relay, and, once the source has copied them and
// asks (finalize), defines the VM here, shut off: its state directory, its
// record and spec, its file. Anything else tears all of it down.

// KindInMove is a move's journal on the destination.
const KindInMove operation.Kind = "move-receive"

// stepMoveDefined is the destination's last step: the VM is defined here.
const stepMoveDefined operation.Step = "move-defined"

// moveInIntent is a move destination's journal: the copies made here (and
// removed unless the VM is defined), whether it wrote the VM's file, and
// whether the VM is enabled for boot once defined.
type moveInIntent struct {
	Copies    []string `json:"copies,omitempty"`
	VMFile    bool     `json:"vm_file,omitempty"`
	Autostart bool     `json:"autostart,omitempty"`
}

// receiveMove serves a move (the protocol's move message m).
func (mg *Migrator) receiveMove(ctx context.Context, peer *migwire.Peer, m migwire.Msg) error {
	d := &incomingVM{mg: mg, autostart: m.Autostart}
	mv := &moveIn{d: d, m: m}
	defer mv.close(ctx)
	if err := mv.prepare(ctx); err != nil {
		err = vmerr.Wrap(m.Name, err)
		_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
		return err
	}
	if err := peer.Send(migwire.Msg{Type: migwire.MsgPrepared, Token: d.token, CertPin: d.certPin, Disks: d.copies, NBD: d.nbdURI}); err != nil {
		return err
	}
	wait := 24 * time.Hour
	if m.Timeout > 0 {
		wait = m.Timeout + 2*time.Minute
	}
	r, err := peer.Recv(ctx, wait)
	if err != nil || r.Type != migwire.MsgFinalize {
		return vmerr.Wrap(d.name, errors.New("move aborted by the source; what it made here is removed"))
	}
	if err := mv.define(ctx); err != nil {
		err = vmerr.Wrap(d.name, err)
		_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
		return err
	}
	return peer.Send(migwire.Msg{Type: migwire.MsgFinalized})
}

// moveIn is the destination's side of one move.
type moveIn struct {
	d         *incomingVM
	m         migwire.Msg
	lk        *operation.Lock
	op        *operation.Op
	stopGuard func()
	in        moveInIntent
	qsd       *storageDaemon
	defined   bool
}

// prepare takes the VM's name here, journals, makes the copies and
// exports them.
func (mv *moveIn) prepare(ctx context.Context) (err error) {
	d, mg := mv.d, mv.d.mg
	if _, err := d.parseSpec(ctx, mv.m); err != nil {
		return err
	}
	if mv.lk, _, err = mg.k.Lock(ctx, d.name, "move-receive"); err != nil {
		return err
	}
	if exists(d.p.Dir) || exists(d.p.State) {
		return errors.New("a VM of that name is defined on this host: vmsup rm it there first, or move another name")
	}
	if d.copies, err = d.planCopies(ctx, mv.m); err != nil {
		return err
	}
	mv.in = moveInIntent{Copies: d.copyFiles(), Autostart: d.autostart}
	guard := func() func() { return mg.env.Guard(ctx, d.name) }
	if mv.op, mv.stopGuard, err = mg.k.BeginGuarded(ctx, d.name, KindInMove, mv.in, guard); err != nil {
		return err
	}
	for _, c := range d.copies {
		if err := (storage.Tools{}).Create(ctx, c.File, c.Format, c.Size, c.Backing, c.BackingFormat); err != nil {
			return fmt.Errorf("disk %q: make the copy's image: %w", c.Name, err)
		}
	}
	mv.op.Step(machine.StepCopies)
	if len(d.copies) == 0 {
		return nil
	}
	return mv.export(ctx)
}

// export serves the copies over a qemu-storage-daemon's NBD server (a
// unix socket among the VM's records), relayed from a TCP port on the
// stream's address with TLS and the token.
func (mv *moveIn) export(ctx context.Context) error {
	d := mv.d
	bin, err := storageDaemonBin(d.mg.env.Opts().QEMU)
	if err != nil {
		return err
	}
	sock := filepath.Join(d.p.Records, "move-nbd.sock")
	os.Remove(sock)
	// The images first: the socket appears once they opened.
	var args, exports []string
	for _, c := range d.copies {
		args = append(args, blockdevArgs(c, false)...)
		exports = append(exports, "--export", jsonArg(map[string]any{"type": "nbd", "id": "migx-" + c.Name,
			"node-name": qemuargs.DiskNodeName(c.Name), "name": c.Export, "writable": true}))
	}
	server := jsonArg(map[string]any{"addr": map[string]string{"type": "unix", "path": sock}})
	args = append(append(args, "--nbd-server", server), exports...)
	if mv.qsd, err = startStorageDaemon(ctx, bin, args, sock); err != nil {
		return err
	}
	rt, err := migwire.NewTLS()
	if err != nil {
		return fmt.Errorf("relay certificate: %w", err)
	}
	d.token, d.certPin = migwire.NewToken(), rt.Pin
	d.nbdRelay, d.nbdURI, err = relayNBD(mv.m.Listen, sock, d.token, rt.Listen, d.mg.log)
	return err
}

// define ends the exports and defines the VM here, shut off; then the
// journal ends.
func (mv *moveIn) define(ctx context.Context) error {
	d, mg := mv.d, mv.d.mg
	if d.nbdRelay != nil {
		d.nbdRelay.Close()
	}
	if err := mv.qsd.stop(); err != nil {
		return fmt.Errorf("disk copies: %w", err)
	}
	mv.qsd = nil
	app, err := mv.record()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.p.Dir, 0o700); err != nil {
		return err
	}
	if d.f.VM.Boot.Firmware == spec.FirmwareUEFI && len(mv.m.UEFIVars) > 0 {
		if err := os.WriteFile(d.p.UEFIVars, mv.m.UEFIVars, 0o600); err != nil {
			return fmt.Errorf("UEFI variable store: %w", err)
		}
	}
	if app.SourceFile == "" || !exists(app.SourceFile) {
		// The source's file is not on this host: vmsup keeps one for it.
		mv.in.VMFile = true
		if err := mv.op.SetIntent(mv.in); err != nil {
			return err
		}
		if app.SourceFile, err = mg.env.State().WriteVMFile(d.f.VM); err != nil {
			return fmt.Errorf("VM file: %w", err)
		}
	}
	if err := mg.env.State().WriteApplied(app, d.f.Raw); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	mv.op.Step(stepMoveDefined)
	mv.defined = true
	if d.autostart {
		if err := mg.enableApplied(ctx, d.name); err != nil {
			mg.log.Warn("enable autostart after a move", "vm", d.name, "err", err)
		}
	}
	return nil
}

// record is the VM's record here: the source's, as of its last start
// (machine type, identity), with nothing of a run.
func (mv *moveIn) record() (*vmstore.Applied, error) {
	m, f := mv.m, mv.d.f
	ids := identity.IDs{UUID: m.UUID, GenID: m.GenID}
	return &vmstore.Applied{Name: f.VM.Name, SourceFile: m.SourceFile, Spec: vmstore.Canonical(&f.VM), Accel: m.Accel,
		CPUModel: m.CPUModel, CPUMasks: m.CPUMasks, Machine: m.Machine, UUID: ids.UUID, GenID: ids.GenID,
		MigratedFrom: m.From}, nil
}

// close tears down what a move that did not finish made here (its
// journal, if this process lives to do it; else the guardian's), and lets
// the VM's lock go.
func (mv *moveIn) close(ctx context.Context) {
	d := mv.d
	if d.nbdRelay != nil {
		d.nbdRelay.Close()
	}
	_ = mv.qsd.stop()
	if mv.op != nil {
		// Undone, the journal goes with the records; else the guardian
		// settles it.
		if mv.defined || d.mg.undoMoveIn(d.name, mv.in) == nil {
			mv.op.End()
			mv.stopGuard()
		}
	}
	if mv.lk != nil {
		mv.lk.Unlock()
	}
}

// undoMoveIn removes what a move that did not define the VM made here:
// the copies, the VM's file if it wrote it, then its records and state
// directory (the VM was not here before), the journal with them.
func (mg *Migrator) undoMoveIn(name string, in moveInIntent) error {
	if err := removeFiles(in.Copies); err != nil {
		return err
	}
	if in.VMFile {
		if err := mg.env.State().RemoveVMFile(name); err != nil {
			return err
		}
	}
	return mg.paths(name).RemoveAll()
}

// recoverMoveIn settles a move destination whose receiver died: the VM is
// defined here if the journal says so, else all of it goes (the source
// keeps the VM: it asks here before it lets its copy go).
func (mg *Migrator) recoverMoveIn(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[moveInIntent](op)
	if err != nil {
		return "", err
	}
	if op.Has(stepMoveDefined) {
		if in.Autostart {
			_ = mg.enableApplied(ctx, name)
		}
		return "the moved VM is defined here", nil
	}
	if err := mg.undoMoveIn(name, in); err != nil {
		return "", fmt.Errorf("remove what the move made: %w", err)
	}
	return fmt.Sprintf("the move had not finished: its %d disk copies and records here are removed", len(in.Copies)), nil
}
