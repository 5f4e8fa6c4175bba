// Package vsock allocates guests' vsock context ids (CIDs) for the VMs under
// one vmsup root, without the race that gives LXD's "unable to set guest
// cid: Address already in use": two starts that each pick "the lowest CID no
// running guest has" and then both hand it to QEMU.
//
// Every choice is made under a file lock and recorded in the same table
// (Dir/cids.json) before the lock goes, so two vmsup processes can never
// pick the same CID. A VM keeps its CID from start to start (a guest's
// peers address it by CID) until Release, at vmsup rm.
//
// Other software (another vmsup root, Incus, Firecracker) does not see the
// table. Allocator.InUse asks the kernel: KernelInUse sets the CID on a
// throw-away /dev/vhost-vsock fd, which the kernel refuses with EADDRINUSE
// while another vhost-vsock fd holds it, then closes the fd. That is a
// check, not a hold: the CID is free again until QEMU sets it on its own
// fd, so outside software can still take it in between. The final check is
// QEMU's own VHOST_VSOCK_SET_GUEST_CID at start, which fails the start with
// "Address already in use"; the next start then picks another CID.
//
// Start (start.go) is its part of a VM's start: the step that takes the
// CID and hands it to QEMU's argv. It starts nothing itself.
package vsock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Allocator hands out CIDs from one table. Allocators on the same Dir, in
// one process or many, share it safely.
type Allocator struct {
	Dir string // holds cids.json and its lock, cids.lock
	// InUse reports whether cid is held on this host outside the table
	// (KernelInUse); nil trusts the table alone.
	InUse func(cid uint32) (bool, error)
}

// InUseError is a CID another VM holds: one of this root's (VM) or
// something outside it (VM "").
type InUseError struct {
	CID uint32
	VM  string
}

func (e *InUseError) Error() string {
	if e.VM == "" {
		return fmt.Sprintf("CID %d is in use on this host by a guest outside this vmsup root (the kernel refuses it)", e.CID)
	}
	return fmt.Sprintf("CID %d is already in use by vm %q", e.CID, e.VM)
}

// table is cids.json: each VM's CID.
type table struct {
	CIDs map[string]uint32 `json:"cids"`
}

func (a Allocator) file() string { return filepath.Join(a.Dir, "cids.json") }

// Acquire returns the CID vm starts with and records it as vm's: fixed
// when not 0 (the spec's cid), else the CID vm already has, else the lowest
// free one from spec.MinVsockCID. A fixed CID held by another VM, or
// (InUse) by something outside the table, is an *InUseError; a recorded
// CID taken from outside is replaced by a free one.
func (a Allocator) Acquire(ctx context.Context, vm string, fixed uint32) (uint32, error) {
	var cid uint32
	err := a.update(ctx, func(t *table) error {
		var err error
		cid, err = a.choose(t, vm, fixed, a.InUse)
		if err == nil {
			t.CIDs[vm] = cid
		}
		return err
	})
	return cid, err
}

// Peek returns what Acquire would return now, without the kernel's view
// and without recording it: the CID an argv shown before a start names.
func (a Allocator) Peek(vm string, fixed uint32) (uint32, error) {
	t, err := a.read()
	if err != nil {
		return 0, err
	}
	return a.choose(t, vm, fixed, nil)
}

// Lookup returns vm's recorded CID, 0 if it has none.
func (a Allocator) Lookup(vm string) (uint32, error) {
	t, err := a.read()
	return t.CIDs[vm], err
}

// Release forgets vm's CID (vmsup rm); a VM without one is no error.
func (a Allocator) Release(ctx context.Context, vm string) error {
	return a.update(ctx, func(t *table) error {
		delete(t.CIDs, vm)
		return nil
	})
}

func (a Allocator) choose(t *table, vm string, fixed uint32, inUse func(uint32) (bool, error)) (uint32, error) {
	held := map[uint32]string{}
	for name, c := range t.CIDs {
		if name != vm {
			held[c] = name
		}
	}
	outside := func(c uint32) (bool, error) {
		if inUse == nil {
			return false, nil
		}
		busy, err := inUse(c)
		if err != nil {
			return false, fmt.Errorf("CID %d: %w", c, err)
		}
		return busy, nil
	}
	if fixed != 0 {
		if other, ok := held[fixed]; ok {
			return 0, &InUseError{CID: fixed, VM: other}
		}
		if busy, err := outside(fixed); err != nil || busy {
			return 0, cmpErr(err, &InUseError{CID: fixed})
		}
		return fixed, nil
	}
	if c, ok := t.CIDs[vm]; ok {
		busy, err := outside(c)
		if err != nil {
			return 0, err
		}
		if !busy {
			return c, nil
		}
	}
	for c := uint64(spec.MinVsockCID); c <= spec.MaxVsockCID; c++ {
		if _, ok := held[uint32(c)]; ok {
			continue
		}
		busy, err := outside(uint32(c))
		if err != nil {
			return 0, err
		}
		if !busy {
			return uint32(c), nil
		}
	}
	return 0, errors.New("no free vsock CID")
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// update changes the table under its lock, writing it back (atomically)
// when fn succeeds.
func (a Allocator) update(ctx context.Context, fn func(*table) error) error {
	if err := os.MkdirAll(a.Dir, 0o700); err != nil {
		return err
	}
	lk, ok, err := vmstore.LockFile(ctx, filepath.Join(a.Dir, "cids.lock"), true)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("vsock CID table %s: lock: %w", a.Dir, cmpErr(ctx.Err(), errors.New("busy")))
	}
	defer lk.Unlock()
	t, err := a.read()
	if err != nil {
		return err
	}
	before := flat(t.CIDs)
	if err := fn(t); err != nil {
		return err
	}
	if slices.Equal(before, flat(t.CIDs)) {
		return nil
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(a.file(), append(b, '\n'), 0o600)
}

// flat flattens a table for comparison.
func flat(m map[string]uint32) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(out)
	return out
}

// read reads the table; a missing one is empty. Writes are atomic
// (rename), so reading needs no lock.
func (a Allocator) read() (*table, error) {
	t := &table{CIDs: map[string]uint32{}}
	b, err := os.ReadFile(a.file())
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("%s: %w", a.file(), err)
	}
	if t.CIDs == nil {
		t.CIDs = map[string]uint32{}
	}
	return t, nil
}
