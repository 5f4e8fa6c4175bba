package livemigrate

import (
	"context"
	"io"
	"os"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// What a source-side recovery learns from the other host: the
// destination's own answer over the migration's transport, or, failing
// that, the write locks on the shared disks.

// askDestination asks the destination's vmsup, over the migration's
// transport, whether it runs the guest. known is false when it cannot say.
func (mg *Migrator) askDestination(ctx context.Context, name string, in migrateIntent) (runs, known bool) {
	state, known := mg.queryDestination(ctx, name, in.Transport)
	return state == migwire.StateRunning, known
}

// queryDestination asks the vmsup at the other end of transport about VM
// name (after it settled its side): running, defined (shut off) or
// absent. known is false when it cannot say.
func (mg *Migrator) queryDestination(ctx context.Context, name string, transport []string) (state string, known bool) {
	if len(transport) == 0 {
		return "", false
	}
	peer, closePeer, err := migwire.Command(transport, io.Discard)
	if err != nil {
		return "", false
	}
	defer closePeer()
	if r, err := peer.Call(ctx, migwire.Msg{Type: migwire.MsgHello, Version: migwire.Version}, migwire.MsgHello, helloTimeout); err != nil || r.Version != migwire.Version {
		return "", false
	}
	r, err := peer.Call(ctx, migwire.Msg{Type: migwire.MsgQuery, Name: name}, migwire.MsgState, queryTimeout)
	if err != nil {
		return "", false
	}
	return r.State, true
}

// queryTimeout bounds a destination's answer: it first waits for its own
// receiver (which holds the VM's lock) to finish or give up.
const queryTimeout = 2 * time.Minute

// answerQuery is the destination's side of askDestination: it settles its
// own side first (its receiver may still be at work: it waits for the VM's
// lock), then says whether the guest runs here.
func (mg *Migrator) answerQuery(ctx context.Context, peer *migwire.Peer, name string) error {
	reply := func(state string, err error) error {
		if err != nil {
			_ = peer.Send(migwire.Msg{Type: migwire.MsgError, Error: err.Error()})
			return err
		}
		return peer.Send(migwire.Msg{Type: migwire.MsgState, State: state})
	}
	if err := spec.ValidName(name); err != nil {
		return reply("", vmerr.Wrap(name, err))
	}
	lctx, cancel := context.WithTimeout(ctx, queryTimeout-15*time.Second)
	defer cancel()
	lk, err := mg.env.State().Lock(lctx, name, "migrate-query", true)
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
		if exists(mg.paths(name).State) { // shut off here (a move's destination)
			return reply(migwire.StateDefined, nil)
		}
		return reply(migwire.StateAbsent, nil)
	}
	c, release, err := mg.env.QMPSession(ctx, name)
	if err != nil {
		return reply("", vmerr.Wrap(name, err))
	}
	defer release()
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		return reply("", vmerr.Wrap(name, err))
	}
	if qs.Status == qmp.RunInMigrate || qs.Status == qmp.RunPostMigrate {
		return reply(migwire.StateAbsent, nil)
	}
	return reply(migwire.StateRunning, nil)
}

// lockedElsewhere tells from the shared file disks whether another QEMU
// (the destination's) holds their write locks. known is false when the VM
// has no such disk.
//
// A disk copied to the destination (copied) says nothing: the
// destination's QEMU locks its own copy, not this host's image.
func (mg *Migrator) lockedElsewhere(name string, copied []string) (locked, known bool) {
	v, _ := mg.env.View(name)
	if v == nil {
		return false, false
	}
	for _, d := range v.Disks {
		if d.File == "" || d.ReadOnly || d.IsCDROM() || slices.Contains(copied, d.File) {
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
