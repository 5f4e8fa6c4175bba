package livemigrate

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// A move of a shut-off VM to another host (vmsup move), the source's side:
// the path of a storage migration (storage_out.go) with no guest and no
// RAM. The destination makes each local disk it does not see and exports
// it (move_in.go); here a qemu-storage-daemon opens the disks read-only
// and mirrors each into its export with the same QMP commands a running
// VM's QEMU takes; once all are in sync the jobs complete, the
// destination defines the VM (finalize), and this host forgets it and,
// unless kept, its copied disks. Journaled (KindMove) with a guardian:
// before finalize is sent the VM stays here; after, the destination's
// answer decides (recoverMove).

// KindMove is a move of a shut-off VM to another host, on the source.
const KindMove operation.Kind = "move"

// Steps of a move on the source, as journaled (with the disks' steps of
// storage_out.go between prepared and finalize-sent).
const (
	stepMovePrepared     operation.Step = "move-prepared"      // the destination made and exports the copies
	stepMoveFinalizeSent operation.Step = "move-finalize-sent" // from here the destination may define the VM
	stepMoveFinalized    operation.Step = "move-finalized"     // it did: this host forgets the VM
)

// qsdSock is the source's storage daemon's monitor.
func qsdSock(p vmstore.Paths) string { return filepath.Join(p.Dir, "move-qsd.sock") }

// Move moves the shut-off VM name to another host (o.To): its local disks
// copied (storage migration's path), then its record and spec; it is
// defined and shut off there and, unless o.KeepSourceDisks, gone from
// here with its copied disks. Of o, the migration's options that concern
// the guest's RAM are ignored.
func (mg *Migrator) Move(ctx context.Context, name string, o migwire.Options) (migwire.Result, error) {
	if err := spec.ValidName(name); err != nil {
		return migwire.Result{}, vmerr.Wrap(name, err)
	}
	if o.Local || o.To == "" {
		return migwire.Result{}, vmerr.Wrap(name, errors.New("move: no destination host (--to HOST)"))
	}
	m := &outgoing{mg: mg, name: name, o: o.WithDefaults(), start: time.Now(), p: mg.paths(name), move: true}
	m.res.VM, m.res.To = name, m.o.To
	defer m.close()
	if err := m.loadShutOff(ctx); err != nil {
		return m.res, vmerr.Wrap(name, err)
	}
	if err := m.journal(ctx); err != nil {
		return m.res, vmerr.Wrap(name, err)
	}
	r, err := m.prepare(ctx)
	if err != nil {
		return m.res, err
	}
	if err := m.copyShutOff(ctx, r); err != nil {
		return m.res, err
	}
	if err := m.finalizeMove(ctx); err != nil {
		return m.res, err
	}
	m.res.Wall = time.Since(m.start)
	return m.res, nil
}

// loadShutOff takes the VM's lock and checks that it can move: shut off,
// nothing of it this host alone could have (snapshots, disks attached or
// moved since its file, a TPM's state).
func (m *outgoing) loadShutOff(ctx context.Context) (err error) {
	mg, name := m.mg, m.name
	if m.lu, err = mg.lockUnit(ctx, name, "move"); err != nil {
		return err
	}
	m.cleanups = append(m.cleanups, m.lu.unlock)
	if st := m.lu.st; st.Exists && st.ActiveState != "inactive" && st.ActiveState != "failed" {
		return fmt.Errorf("move: it is %s; vmsup move moves a shut-off VM: stop it first, or move it running with vmsup migrate %s --to HOST",
			st.ActiveState, name)
	}
	v, err := mg.env.State().View(name)
	if errors.Is(err, vmstore.ErrNoRecord) {
		return mg.env.NotFound(name)
	} else if err != nil {
		return err
	}
	m.app = v.Applied
	if err := movable(v); err != nil {
		return err
	}
	if m.raw, err = os.ReadFile(m.p.Spec); err != nil {
		return err
	}
	if m.f, err = spec.Parse(cmp.Or(m.app.SourceFile, m.p.Spec), m.raw); err != nil {
		return fmt.Errorf("applied spec: %w", err)
	}
	if m.f.VM.TPM != nil {
		return errors.New("move: the VM has a TPM, whose state vmsup move does not carry: move it running (vmsup migrate) instead")
	}
	m.cands, err = m.shutOffCandidates(ctx)
	return err
}

// movable refuses a shut-off VM with what its file does not say and a
// move would lose.
func movable(v *vmstore.View) error {
	for _, d := range v.Disks {
		switch {
		case d.Attached:
			return fmt.Errorf("move: disk %q was attached (vmsup disk attach), not in the VM's file: detach it first", d.Name)
		case d.MovedFrom != "":
			return fmt.Errorf("move: disk %q was moved (vmsup disk move) and the VM's file still names its old image: update the file first", d.Name)
		}
	}
	if !v.Tree.Empty() {
		return errors.New("move: the VM has snapshots, whose images are on this host: remove them first (vmsup snapshot rm)")
	}
	return nil
}

// shutOffCandidates are the disks a destination may take a copy of, as
// diskCandidates, their format and size read from the images (no QEMU
// runs); a disk whose image was never made (the VM never started) has
// nothing to copy.
func (m *outgoing) shutOffCandidates(ctx context.Context) ([]migwire.DiskCopy, error) {
	var out []migwire.DiskCopy
	for i, d := range m.f.VM.Disks {
		if d.Type != spec.DiskFile || d.ReadOnly || !filepath.IsAbs(d.File) || !exists(d.File) {
			continue
		}
		info, err := storage.Tools{}.Info(ctx, d.File, d.Format)
		if err != nil {
			return nil, fmt.Errorf("disk[%d] %q: %w", i, d.Name, err)
		}
		c := migwire.DiskCopy{Name: d.Name, File: d.File, Format: info.Format, Size: info.VirtualSize}
		if err := m.baseOf(d, &c); err != nil {
			return nil, fmt.Errorf("disk[%d] %q: %w", i, d.Name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// copyShutOff copies the disks the destination made (r.Disks) through a
// storage daemon holding this host's images read-only, until every copy
// is in sync, then completes the jobs (the images do not change: no guest
// runs).
func (m *outgoing) copyShutOff(ctx context.Context, r migwire.Msg) error {
	if len(r.Disks) == 0 {
		return nil
	}
	bin, err := storageDaemonBin(m.mg.env.Opts().QEMU)
	if err != nil {
		return m.fail("disks", "source", err)
	}
	sock := qsdSock(m.p)
	os.Remove(sock)
	var args []string // the images first: the socket appears once they opened
	for _, c := range r.Disks {
		args = append(args, blockdevArgs(c, true)...)
	}
	args = append(args, "--chardev", "socket,id=mon,path="+strings.ReplaceAll(sock, ",", ",,")+",server=on,wait=off", "--monitor", "chardev=mon")
	qsd, err := startStorageDaemon(ctx, bin, args, sock)
	if err != nil {
		return m.fail("disks", "source", err)
	}
	m.cleanups = append(m.cleanups, func() { _ = qsd.stop(); os.Remove(sock) })
	dctx, cancel := context.WithTimeout(ctx, qmpConnectTimeout)
	m.mon, err = qmp.Dial(dctx, sock, qmp.WithLogger(m.mg.log), qmp.WithoutSymlink(), qmp.WithCommandTimeout(monitorCommandTimeout))
	cancel()
	if err != nil {
		return m.fail("disks", "source", fmt.Errorf("qemu-storage-daemon's monitor: %w", err))
	}
	m.cleanups = append(m.cleanups, func() { m.mon.Close() })
	if err := m.mirror(ctx, r); err != nil {
		return err
	}
	if err := m.endMirrors(ctx); err != nil {
		return m.fail("disks", "source", err)
	}
	return nil
}

// finalizeMove has the destination define the VM, then forgets it here.
func (m *outgoing) finalizeMove(ctx context.Context) error {
	// Journaled before it is sent: from here only the destination can say
	// where the VM is.
	m.step(stepMoveFinalizeSent)
	m.finalized = true // no abort from here: the destination may have defined it
	if _, err := m.peer.Call(ctx, migwire.Msg{Type: migwire.MsgFinalize}, migwire.MsgFinalized, finalizeTimeout); err != nil {
		var re *migwire.RemoteError
		if errors.As(err, &re) { // it said no and removed what it made
			return m.fail("finalize", "source", err)
		}
		return m.fail("finalize", "unknown: the guardian asks "+m.o.To+" and settles it", err)
	}
	m.step(stepMoveFinalized)
	if note := m.mg.forgetMoved(context.WithoutCancel(ctx), m.name, m.in); note != "" {
		m.res.Note = note
	}
	return nil
}

// forgetMoved forgets a VM defined on the destination now: its copied
// disks here (unless kept), then the VM itself (its records last).
func (mg *Migrator) forgetMoved(ctx context.Context, name string, in migrateIntent) string {
	var note string
	if !in.KeepDisks {
		if err := removeFiles(in.Copies); err != nil {
			note = "the copied disks here could not all be removed: " + err.Error()
		}
	}
	if in.Autostart { // the destination enabled it
		if err := mg.env.Disable(ctx, name); err != nil {
			mg.log.Warn("disable autostart after a move", "vm", name, "err", err)
		}
	}
	if err := mg.env.ForgetMoved(ctx, name); err != nil {
		mg.log.Warn("forget the moved VM", "vm", name, "err", err)
		note = strings.TrimPrefix(note+"; ", "; ") + "its records here could not all be removed: " + err.Error()
	}
	return note
}

// recoverMove settles a move whose vmsup died: before finalize was sent
// the VM stays here (the destination removes what it made when its
// source goes); after, the destination says whether it defined the VM
// (asking settles its side first), and this host forgets it if so.
func (mg *Migrator) recoverMove(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[migrateIntent](op)
	if err != nil {
		return "", err
	}
	for _, f := range append([]string{in.NBDSock, qsdSock(mg.paths(name))}, in.Markers...) {
		if f != "" {
			os.Remove(f)
		}
	}
	moved := op.Has(stepMoveFinalized)
	if !moved && op.Has(stepMoveFinalizeSent) {
		state, known := mg.queryDestination(ctx, name, in.Transport)
		if !known {
			return "", fmt.Errorf("move to %s: cannot learn whether %s defined the VM (it does not answer): the VM stays here until it does", in.To, in.To)
		}
		moved = state != migwire.StateAbsent
	}
	if !moved {
		return "the move had not finished: the VM stays here, shut off", nil
	}
	note := "the VM was moved to " + in.To + ": it is gone from here"
	if n := mg.forgetMoved(ctx, name, in); n != "" {
		note += "; " + n
	}
	return note, nil
}
