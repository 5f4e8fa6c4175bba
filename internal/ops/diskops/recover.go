package diskops

import (
	"context"
	"errors"

	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// Every recoverer here has one shape, after libvirt's
// qemuProcessRecoverJob: it looks (the journal's steps, the intent, and
// what QEMU and systemd say through the small interfaces below), a pure
// decide function maps what it saw to a typed action, and a short
// executor does that action; the action's note is what the CLI shows. A
// decision that needs one more look, or a job settled before it can look
// (a move's: the device's node once its job is cancelled or awaited),
// returns that as its action, and the executor does it and decides again:
// what is asked, and when, is part of the decision. The decisions are
// table-tested without a VM.

// The QMP and systemd calls recovery makes to see the VM's state,
// declared here at their consumer so that tests give stand-ins. A
// *qmp.Conn is runStates; qemuBlocks makes one a blockState; envUnits
// makes the environment unitStates.

// runStates reads a QEMU's run state and its migration's (a memory save).
type runStates interface {
	QueryStatus(ctx context.Context) (qmp.StatusInfo, error)
	QueryMigrate(ctx context.Context) (qmp.MigrationInfo, error)
}

// blockState reads QEMU's block layer: its jobs, its named nodes, the
// format node open on an image file, the chain a node is in (root "" and
// an error when none), the node a disk's device runs on.
type blockState interface {
	QueryJobs(ctx context.Context) ([]qmp.Job, error)
	QueryNamedBlockNodes(ctx context.Context) ([]qmp.BlockNode, error)
	NodeOn(ctx context.Context, path string) (qmp.BlockNode, error)
	RootOf(ctx context.Context, node string) (root, above string, err error)
	DeviceNode(ctx context.Context, disk string) (string, error)
}

// unitStates reads systemd's view of a VM's unit, the run state of a QEMU
// that may have no session yet (its socket only), and whether a VM runs.
type unitStates interface {
	UnitStatus(ctx context.Context, name string) (units.Status, error)
	RunState(ctx context.Context, sock string) qmp.RunState
	Running(ctx context.Context, name string) bool
}

var (
	_ runStates  = (*qmp.Conn)(nil)
	_ blockState = qemuBlocks{}
	_ unitStates = envUnits{}
)

// qemuBlocks is a monitor's blockState: the raw queries, and the lookups
// internal/lifecycle/qdev makes of them.
type qemuBlocks struct{ *qmp.Conn }

func (q qemuBlocks) NodeOn(ctx context.Context, path string) (qmp.BlockNode, error) {
	return qdev.FindNode(ctx, q.Conn, path)
}

func (q qemuBlocks) RootOf(ctx context.Context, node string) (string, string, error) {
	return qdev.RootOf(ctx, q.Conn, node)
}

func (q qemuBlocks) DeviceNode(ctx context.Context, disk string) (string, error) {
	return qdev.DeviceNode(ctx, q.Conn, disk)
}

// envUnits is the environment's unitStates: systemd's unit, the QEMU at
// a socket, the guest's run state.
type envUnits struct{ env *machine.Env }

func (u envUnits) UnitStatus(ctx context.Context, name string) (units.Status, error) {
	sd, err := u.env.Systemd(ctx)
	if err != nil {
		return units.Status{}, err
	}
	return sd.Status(ctx, u.env.State().UnitOf(name))
}

func (u envUnits) RunState(ctx context.Context, sock string) qmp.RunState {
	return u.env.RunStateAt(ctx, sock)
}

func (u envUnits) Running(ctx context.Context, name string) bool { return u.env.Running(ctx, name) }

// qemuSeen is whether recovery reached the VM's QEMU.
type qemuSeen uint8

const (
	qemuAnswers qemuSeen = iota + 1 // its monitor answered
	qemuGone                        // no QEMU runs the VM (nor is it known)
	qemuUnknown                     // the monitor could not be had: ask again later
)

// seeQEMU is what a session's error says of the QEMU.
func seeQEMU(err error) qemuSeen {
	switch {
	case err == nil:
		return qemuAnswers
	case errors.Is(err, vmstore.ErrNotRunning), errors.Is(err, vmstore.ErrNotFound):
		return qemuGone
	}
	return qemuUnknown
}

// session is the running VM's monitor for a recovery, with what reaching
// it said: c is nil unless the QEMU answers; release is always callable.
func (s *Service) session(ctx context.Context, name string) (c *qmp.Conn, seen qemuSeen, release func(), err error) {
	c, release, err = s.env.QMPSession(ctx, name)
	if seen = seeQEMU(err); seen != qemuAnswers {
		return nil, seen, func() {}, err
	}
	return c, seen, release, nil
}
