package nics

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// A local migration moves the guest into a new QEMU while the old one
// holds each NIC's tap (a tap takes one QEMU at a time). The new QEMU gets
// a second tap per NIC on the same bridge, recorded as the NIC's next tap
// before it is made (a managed network's with the NIC's filter, for the
// same MAC and address). The guest's frames reach it once QEMU's (or the
// guest's) announcement after the switch-over teaches the bridge, or once
// the old tap goes (the bridge forgets the old port's addresses and
// floods). Then:
//
//   - CommitMove (the new QEMU runs the guest, the old one is gone)
//     removes the old taps and makes the next ones the NICs' taps (a
//     managed network's attachment, lease and names follow the tap);
//   - AbortMove (the old QEMU keeps the guest) removes the next taps;
//   - Teardown removes both, whatever was left.
//
// Each works from the record alone and is idempotent, so a killed
// migration's recovery ends with one QEMU and one working tap per NIC.

// StepMoveTaps is a local migration destination's step that makes its
// QEMU's taps.
const StepMoveTaps = "move taps"

var _ startplan.Mover = Start{}

// CanMove says whether a local migration can give the NIC a second tap:
// a Linux bridge, an OVS bridge or a managed network's bridge takes
// another port; a CNI attachment (its plugins' address and routes, in the
// VM's namespace) belongs to its one tap.
func CanMove(n spec.NIC) error {
	if n.Type == spec.NICCNI {
		return fmt.Errorf("nic %q is a cni NIC, whose CNI attachment belongs to its one tap: restart the VM instead (or migrate it to another host)", n.Name)
	}
	return nil
}

// NextTap is the tap a local migration's new QEMU gets for a NIC whose
// file names tap own and whose QEMU has tap now: the two names take turns.
func NextTap(own, now string) string {
	if now != own {
		return own
	}
	h := sha256.Sum256([]byte("next/" + own))
	return "vmm" + hex.EncodeToString(h[:])[:11]
}

// MoveSteps is the network's part of a local migration destination's
// start: a second tap per NIC for the new QEMU, removed again if the start
// is undone.
func (s Start) MoveSteps(f *spec.File, plan *startplan.Plan) []steps.Step {
	vm := f.VM.Name
	if !slices.ContainsFunc(f.VM.NICs, func(n spec.NIC) bool { return n.UsesTap() }) {
		return nil
	}
	return []steps.Step{{Name: StepMoveTaps, Do: func(ctx context.Context) error {
		owner, err := s.Owner(ctx, vm)
		if err != nil {
			return err
		}
		taps, err := s.PrepareMove(ctx, vm, f, owner)
		if err != nil {
			return err
		}
		plan.AddArgv(func(o *qemuargs.Options) { o.Taps = taps })
		return nil
	}, Undo: func(ctx context.Context) {
		if err := s.AbortMove(ctx, vm); err != nil {
			s.Logger.Warn("local migration: remove the new QEMU's taps", "vm", vm, "err", err)
		}
	}}}
}

// PrepareMove makes each tap NIC's next tap, recorded first, and returns
// them by NIC name (qemuargs.Options.Taps). On failure none is left.
func (m *Manager) PrepareMove(ctx context.Context, vm string, f *spec.File, owner Owner) (map[string]string, error) {
	taps := map[string]string{}
	made := false // something may be recorded
	err := m.editRecord(ctx, vm, func(p vmstore.Paths, st *Record) error {
		if err := checkMove(st, f); err != nil {
			return err
		}
		made = true
		for i := range st.NICs {
			r := &st.NICs[i]
			j := slices.IndexFunc(f.VM.NICs, func(n spec.NIC) bool { return n.Name == r.Name })
			if r.Tap == "" || j < 0 {
				continue // hot-plugged NICs are refused before
			}
			n := f.VM.NICs[j]
			r.Next = NextTap(n.Tap, r.Tap)
			if err := WriteRecord(p, st); err != nil {
				return err
			}
			if err := m.plugNext(ctx, vm, n, *r, owner, st.SecurityGroups); err != nil {
				return fmt.Errorf("nic %q: the new QEMU's tap %s: %w", n.Name, r.Next, err)
			}
			taps[n.Name] = r.Next
		}
		return nil
	})
	if err != nil && made {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		if aerr := m.AbortMove(uctx, vm); aerr != nil {
			m.Logger.Warn("local migration: remove the new QEMU's taps", "vm", vm, "err", aerr)
		}
	}
	return taps, err
}

// checkMove refuses a move the record's NICs cannot make: a NIC CanMove
// refuses, or one an earlier move left with two taps (its settling failed,
// with a warning): which of them the running QEMU holds is not recorded.
func checkMove(st *Record, f *spec.File) error {
	for _, r := range st.NICs {
		j := slices.IndexFunc(f.VM.NICs, func(n spec.NIC) bool { return n.Name == r.Name })
		if r.Tap == "" || j < 0 {
			continue
		}
		if err := CanMove(f.VM.NICs[j]); err != nil {
			return err
		}
		if r.Next != "" {
			return fmt.Errorf("nic %q: an earlier local migration left it two taps (%s, %s): restart the VM before migrating it on this host again", r.Name, r.Tap, r.Next)
		}
	}
	return nil
}

// plugNext makes r's next tap as NICUp made its first, on the same bridge;
// groups are the VM's security groups (a managed network's filter).
func (m *Manager) plugNext(ctx context.Context, vm string, n spec.NIC, r NICRecord, owner Owner, groups []spec.SecurityGroup) error {
	mac, _ := net.ParseMAC(n.MAC)
	tap := netsetup.Tap{Name: r.Next, Owner: owner.UID, Group: owner.GID, MTU: n.MTU, GuestMAC: mac, Queues: n.Queues}
	switch r.Type {
	case spec.NICBridge, spec.NICOVS:
		return m.plugSwitchTap(ctx, vm, n.Name, tap, r.Type, r.Bridge, r.OVSDB)
	case spec.NICNetwork:
		return m.plugNextManaged(vm, r, tap, groups)
	}
	return fmt.Errorf("a %s NIC cannot have a second tap", r.Type)
}

// AbortMove removes the next taps: the old QEMU keeps the guest.
func (m *Manager) AbortMove(ctx context.Context, vm string) error {
	return m.editRecord(ctx, vm, func(p vmstore.Paths, st *Record) error {
		var errs []error
		for i := range st.NICs {
			r := &st.NICs[i]
			if r.Next == "" {
				continue
			}
			if err := m.tapDown(ctx, *r, r.Next); err != nil {
				errs = append(errs, fmt.Errorf("nic %q: %w", r.Name, err))
				continue
			}
			r.Next = ""
		}
		return errors.Join(append(errs, WriteRecord(p, st))...)
	})
}

// CommitMove makes the next taps the NICs' own and removes the old ones:
// the new QEMU runs the guest and the old one is gone.
func (m *Manager) CommitMove(ctx context.Context, vm string) error {
	return m.editRecord(ctx, vm, func(p vmstore.Paths, st *Record) error {
		var errs []error
		for i := range st.NICs {
			r := &st.NICs[i]
			if r.Next == "" {
				continue
			}
			if err := m.tapDown(ctx, *r, r.Tap); err != nil {
				errs = append(errs, fmt.Errorf("nic %q: the old QEMU's tap: %w", r.Name, err))
				continue
			}
			if r.Type == spec.NICNetwork {
				if m.Networks == nil {
					errs = append(errs, fmt.Errorf("nic %q: %w", r.Name, errNoNetworks))
					continue
				}
				if err := m.Networks.MoveTap(ctx, r.Network, r.Tap, r.Next); err != nil {
					errs = append(errs, fmt.Errorf("nic %q: %w", r.Name, err))
					continue
				}
			}
			r.Tap, r.Next = r.Next, ""
		}
		return errors.Join(append(errs, WriteRecord(p, st))...)
	})
}

// tapDown removes one tap of a bridge, OVS or managed network NIC (its
// OVS port first; a managed network's filter after), leaving a managed
// network's attachment.
func (m *Manager) tapDown(ctx context.Context, r NICRecord, tap string) error {
	if tap == "" {
		return nil
	}
	if r.Type == spec.NICNetwork {
		return errors.Join(netsetup.DeleteTap(tap), nicfilter.Remove(tap))
	}
	if r.Type == spec.NICOVS {
		if netsetup.LinkExists(tap) && !netsetup.IsTap(tap) {
			return fmt.Errorf("tap %s: the link of that name is not a tap; left alone with its OVS port", tap)
		}
		if err := m.ovs(r.OVSDB).DelPort(ctx, tap); err != nil {
			return err
		}
	}
	return netsetup.DeleteTap(tap)
}

// editRecord runs edit on the VM's network record under its lock; no
// record is nothing to do.
func (m *Manager) editRecord(ctx context.Context, vm string, edit func(vmstore.Paths, *Record) error) error {
	p := m.Store.Paths(vm)
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lk, ok, err := vmstore.LockFile(lctx, p.NetLock(), true)
	if err != nil {
		return fmt.Errorf("network lock: %w", err)
	}
	if !ok {
		return errors.New("network lock: not free within 30s")
	}
	defer lk.Unlock()
	st, err := ReadRecord(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return edit(p, st)
}

// plugNextManaged makes a managed network NIC's next tap: its filter first
// (the NIC's attachment's MAC and address, for the new tap's name), then
// the tap on the network's bridge.
func (m *Manager) plugNextManaged(vm string, r NICRecord, tap netsetup.Tap, groups []spec.SecurityGroup) error {
	if m.Networks == nil {
		return errNoNetworks
	}
	a, err := m.Networks.Lookup(r.Network, r.Tap)
	if err != nil {
		return fmt.Errorf("network %q: the attachment of tap %s: %w", r.Network, r.Tap, err)
	}
	next := *a
	next.Tap = tap.Name
	if err := netmanage.Filter(&next, r.AllowSpoofing, spec.PickGroups(groups, r.SecurityGroups)); err != nil {
		return err
	}
	if tap.MTU == 0 {
		mtu, err := netsetup.CheckBridge(a.Bridge)
		if err != nil {
			return err
		}
		tap.MTU = mtu
	}
	if err := m.createTap(vm, tap); err != nil {
		return err
	}
	return netsetup.AttachBridge(tap.Name, a.Bridge)
}
