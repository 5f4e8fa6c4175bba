package livemigrate

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// CPR (QEMU 10's cpr-transfer) on one host: the new QEMU takes the guest's
// RAM in place instead of having it copied, so the guest's pause does not
// grow with its memory. The VM's RAM must be shared memory (a memfd with
// share=on, and aux-ram-share=on for the machine's other RAM: a start on a
// QEMU with cpr-transfer gives it that, qemuargs.Options.ShareRAM). The
// flow:
//
//  1. prepare{cpr}: the destination's QEMU starts with -incoming defer and
//     a second -incoming, the cpr channel (a unix socket in its incoming
//     directory), and waits there: no monitor, no disks yet.
//  2. The source's QEMU runs migrate with both channels (mode
//     cpr-transfer): it sends its state and the RAM's descriptors on the
//     cpr channel, the guest still running, and waits for the destination
//     to close that channel.
//  3. listen: the destination's QEMU made its machine from that state and
//     answers QMP; vmsup plugs its disks and has it listen for the stream,
//     which closes the cpr channel. The source's QEMU stops the guest and
//     sends the devices' state only (its RAM is already there).
//  4. finalize and hand-over as for any migration: the destination runs
//     the guest (cont), the source's QEMU quits.
//
// Any failure before finalize leaves the guest on the source, as for a
// normal migration: until step 3 ends the source never stopped it.

// decideMode says whether a migration hands the guest's RAM over in place
// (cpr-transfer) and, for a local one that does not, why. ram is how the
// source's QEMU holds it (nil: started before vmsup recorded it); host
// says whether this host's QEMU has cpr-transfer, or why not.
func decideMode(o migwire.Options, vm *spec.VM, ram *qemuargs.RAM, host func() (bool, string)) (cpr bool, why string) {
	switch {
	case !o.Local:
		return false, "" // across hosts the RAM is always copied
	case o.NoCPR:
		return false, "asked to copy the guest's RAM (no-cpr)"
	case o.Postcopy:
		return false, "postcopy asked for"
	case o.Multifd > 0:
		return false, "multifd asked for"
	}
	if ok, why := host(); !ok {
		return false, why
	}
	switch {
	case ram != nil && ram.Shared:
		return true, ""
	case vm.SharedMemory != nil && !*vm.SharedMemory:
		return false, "its file keeps its memory private (shared_memory = false)"
	case vm.Hugepages != "":
		return false, "its memory is on hugepages (a private hugetlbfs mapping a new QEMU cannot take over)"
	case vm.SEV != nil:
		return false, "its memory is encrypted (SEV)"
	}
	return false, "it was started without a shared memory backend (on a QEMU without cpr-transfer, or before vmsup gave guests one): " +
		"the next start, or this migration's new QEMU, has one"
}

// modeParam is the migration mode the source's QEMU gets: cpr-transfer,
// or normal where its QEMU has modes (QEMU keeps the last one set; a
// QEMU with shared guest RAM is one with cpr-transfer), else none.
func modeParam(cpr bool, ram *qemuargs.RAM) string {
	switch {
	case cpr:
		return migwire.ModeCPRTransfer
	case ram != nil && ram.Shared:
		return migwire.ModeNormal
	}
	return ""
}

// awaitCPRChannel is a cpr-transfer destination's incoming step: its QEMU
// listens on its cpr channel (or its unit ended).
func (d *incomingVM) awaitCPRChannel(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, prepareTimeout)
	defer cancel()
	sd, err := d.mg.env.Systemd(ctx)
	if err != nil {
		return err
	}
	unit, sock := d.st.Unit(), d.st.Sockets().CPR()
	for !exists(sock) {
		st, err := sd.Status(ctx, unit)
		if err != nil {
			return err
		}
		if st.Gone() {
			return fmt.Errorf("QEMU exited (%s): %s", cmp.Or(st.ExitReason(), st.ActiveState), d.mg.env.LastWords(ctx, unit))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("new QEMU did not open its cpr channel within %s", prepareTimeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
	d.cprSock = sock
	d.uri = "unix:" + filepath.Join(d.st.Sockets().Dir, "migrate.sock")
	return nil
}

// listenCPR is a cpr-transfer destination's answer to listen: its QEMU
// has the source's state (it answers QMP), gets its disks, and listens for
// the stream, which tells the source to stop the guest and send it.
func (d *incomingVM) listenCPR(ctx context.Context) error {
	if d.cprSock == "" {
		return fmt.Errorf("not a cpr-transfer destination")
	}
	if err := d.dialMonitor(ctx); err != nil {
		return err
	}
	if err := d.st.PlugDisks(ctx); err != nil {
		return err
	}
	if err := d.mon.MigrateSetCapabilities(ctx, migwire.Caps(0, false, false)); err != nil {
		return fmt.Errorf("migration capabilities: %w", err)
	}
	if err := d.mon.MigrateIncoming(ctx, d.uri); err != nil {
		return fmt.Errorf("listen for the migration on %s: %w", d.uri, err)
	}
	return nil
}

// contTimed runs cont on the destination and returns when its guest
// resumed (its QEMU's RESUME event; zero if not seen).
func contTimed(ctx context.Context, mon *qmp.Conn) (time.Time, error) {
	sub, unsub := mon.Subscribe(ctx)
	defer unsub()
	if err := mon.Cont(ctx); err != nil {
		return time.Time{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ev, err := qmp.WaitEvent(wctx, sub, "RESUME", nil)
	if err != nil {
		return time.Time{}, nil
	}
	return migwire.EventTime(ev), nil
}

// waitingForCPR reports whether the QEMU whose monitor would be qmpSock is
// a cpr-transfer destination still waiting for its source's state: it has
// no monitor yet, so it does not run the guest (the source stops it only
// once the destination listens for the stream, which needs that monitor).
func waitingForCPR(qmpSock string) bool {
	_, err := os.Stat(qmpSock)
	return os.IsNotExist(err) && exists(filepath.Join(filepath.Dir(qmpSock), "cpr.sock"))
}
