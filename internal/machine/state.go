package machine

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/units"
)

// What vmsup keeps of a VM between commands lives in internal/vm/vmstore:
// paths, records, locks, unit names. These are the supervisor's handles on it.

// BusyError says another vmsup command holds the VM's lock.
type BusyError = vmstore.BusyError

// AttachedDisk is a disk hot-plugged into a running VM, recorded so that
// status shows it and the next up boots with it.
type AttachedDisk = vmstore.AttachedDisk

func (s *Env) Paths(name string) vmstore.Paths { return s.state.Paths(name) }

// Lock takes the VM's Lock for a state-changing command (waiting for it
// with Options.WaitForLock), then finishes or undoes what a killed command
// left (the operation kernel), so that every command starts from a settled
// VM. In a context holding the Lock (an apply's changes) it is borrowed.
func (s *Env) Lock(ctx context.Context, name, op string) (*operation.Lock, error) {
	lk, _, err := s.ops.Lock(ctx, name, op)
	return lk, err
}

// LockedUnit is the prologue of the commands that change whether a VM runs
// (down, migrate, rm): the systemd connection, the VM's lock (held until
// unlock) and its unit's state read under it.
type LockedUnit struct {
	sd   *units.Manager
	lk   *operation.Lock
	unit string
	st   units.Status
	note string // what recovery did, if anything
}

func (s *Env) LockUnit(ctx context.Context, name, op string) (*LockedUnit, error) {
	sd, err := s.Systemd(ctx)
	if err != nil {
		return nil, err
	}
	lk, note, err := s.ops.Lock(ctx, name, op)
	if err != nil {
		return nil, err
	}
	u := &LockedUnit{sd: sd, lk: lk, note: note}
	u.unit = s.state.UnitOf(name)
	if u.st, err = sd.LoadedStatus(ctx, u.unit); err != nil {
		lk.Unlock()
		return nil, err
	}
	return u, nil
}

func (u *LockedUnit) unlock() { u.lk.Unlock() }
