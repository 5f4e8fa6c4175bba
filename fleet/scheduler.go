package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// Scheduler places VMs: one pass reads the fleet, decides, and commits
// each decision as a compare-and-swap on the placement key, so exactly one
// decision wins even if two schedulers ever ran (the election makes one).
type Scheduler struct {
	Store *Store
	Log   *slog.Logger
	// Fence cuts a lost host off the shared disks of a VM before the VM
	// is restarted elsewhere (nil: VMs of lost hosts are never restarted).
	Fence Fencer
	// Decided, when set, gets how long each first placement took, from
	// the choice to the committed transaction (a pass reads the fleet once
	// for all its decisions): the figures.
	Decided func(vm string, d time.Duration)
}

// Fencer fences a lost host from one VM's shared disks (Ceph: blocklist
// its clients, take over the RBD locks); an error leaves the VM where it is.
type Fencer interface {
	Fence(ctx context.Context, lost string, vm *spec.VM) error
}

// errRaced ends a pass whose compare-and-swap lost to another writer.
var errRaced = errors.New("the fleet changed during the pass; the next pass reads it again")

// Pass runs one scheduling pass over a fresh read of the fleet.
func (s *Scheduler) Pass(ctx context.Context) error {
	snap, err := s.Store.Load(ctx, false)
	if err != nil {
		return err
	}
	hosts := slices.Collect(maps.Values(snap.Hosts))
	slices.SortFunc(hosts, func(a, b Host) int { return cmpString(a.Name, b.Name) })
	loads := loadsOf(snap)
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(snap.VMs)) {
		rec := snap.VMs[name]
		f, perr := spec.Parse(rec.Value.File, []byte(rec.Value.TOML))
		p, placed := snap.Placements[name]
		switch {
		case perr != nil:
			// (apply validates; a spec stored by an older vmsup may not parse)
			errs = append(errs, s.status(ctx, snap, name, Status{State: StateInvalid, Reason: perr.Error()}))
		case !placed:
			t0 := time.Now()
			host, err := Choose(RequestOf(&f.VM), hosts, loads)
			if err != nil {
				errs = append(errs, s.unschedulable(ctx, snap, name, "", err))
				continue
			}
			ok, err := s.Store.place(ctx, rec, host)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !ok {
				// Someone changed the fleet since the read: every later
				// choice here would rest on stale loads. The next pass
				// reads again.
				return errors.Join(append(errs, errRaced)...)
			}
			loads = append(loads, Load{Request: RequestOf(&f.VM), Host: host})
			if s.Decided != nil {
				s.Decided(name, time.Since(t0))
			}
			s.log().Info("placed", "vm", name, "host", host)
		case !alive(snap, p.Value.Host):
			errs = append(errs, s.failover(ctx, snap, rec, p, f, hosts, &loads))
		case snap.Cordoned[p.Value.Host] && p.Value.Target == "":
			target, err := Choose(RequestOf(&f.VM), hosts, loads, p.Value.Host)
			if err != nil {
				errs = append(errs, s.unschedulable(ctx, snap, name, p.Value.Host, err))
				continue
			}
			next := p.Value
			next.Target = target
			if ok, err := s.Store.movePlacement(ctx, name, p.Rev, next, &Status{Host: p.Value.Host, State: StateMigrating, Reason: "drain: to " + target}); err != nil || !ok {
				errs = append(errs, err)
				continue
			}
			loads = append(loads, Load{Request: RequestOf(&f.VM), Host: target})
			s.log().Info("drain", "vm", name, "from", p.Value.Host, "to", target)
		case p.Value.Target != "" && !alive(snap, p.Value.Target):
			// The drain's target died: the VM stays, the next pass picks again.
			next := p.Value
			next.Target = ""
			_, err := s.Store.movePlacement(ctx, name, p.Rev, next, nil)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (s *Scheduler) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

func alive(snap *Snapshot, host string) bool { _, ok := snap.Hosts[host]; return ok }

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// loadsOf is what every placed VM takes: on its host, and on its drain
// target as well while it moves.
func loadsOf(snap *Snapshot) []Load {
	var loads []Load
	for name, p := range snap.Placements {
		rec, ok := snap.VMs[name]
		if !ok {
			continue
		}
		f, err := spec.Parse(rec.Value.File, []byte(rec.Value.TOML))
		if err != nil {
			continue
		}
		r := RequestOf(&f.VM)
		loads = append(loads, Load{Request: r, Host: p.Value.Host})
		if p.Value.Target != "" {
			loads = append(loads, Load{Request: r, Host: p.Value.Target})
		}
	}
	return loads
}

// status writes st unless the stored status already says the same.
func (s *Scheduler) status(ctx context.Context, snap *Snapshot, name string, st Status) error {
	if cur, ok := snap.Statuses[name]; ok && cur.Value.State == st.State && cur.Value.Reason == st.Reason && cur.Value.Host == st.Host {
		return nil
	}
	return s.Store.PutStatus(ctx, name, st)
}

func (s *Scheduler) unschedulable(ctx context.Context, snap *Snapshot, name, host string, err error) error {
	var u *Unschedulable
	if !errors.As(err, &u) {
		return err
	}
	if host != "" { // a drain that finds no target: the VM runs on
		cur := snap.Statuses[name].Value
		cur.Reason = "drain: " + u.Reason
		return s.status(ctx, snap, name, cur)
	}
	return s.status(ctx, snap, name, Status{State: StateUnschedulable, Reason: u.Reason})
}

// failover restarts a lost host's VM elsewhere, only when every writable
// disk is on storage vmsup can fence (RBD), and only after fencing.
func (s *Scheduler) failover(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], p Entry[Placement], f *spec.File, hosts []Host, loads *[]Load) error {
	name, lost := rec.Value.Name, p.Value.Host
	if why := LocalDisk(&f.VM); why != "" {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost,
			Reason: fmt.Sprintf("host %s is down (its lease expired); not restarted elsewhere: %s", lost, why)})
	}
	if s.Fence == nil {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost, Reason: fmt.Sprintf("host %s is down; no fencing configured, so not restarted elsewhere", lost)})
	}
	target, err := Choose(RequestOf(&f.VM), hosts, *loads, lost)
	if err != nil {
		return s.unschedulable(ctx, snap, name, "", err)
	}
	if err := s.Fence.Fence(ctx, lost, &f.VM); err != nil {
		return s.status(ctx, snap, name, Status{Host: lost, State: StateLost, Reason: fmt.Sprintf("host %s is down; fencing it failed, so not restarted: %v", lost, err)})
	}
	next := Placement{Host: target, Epoch: p.Value.Epoch + 1}
	ok, err := s.Store.movePlacement(ctx, name, p.Rev, next, &Status{Host: target, State: StatePending, Reason: fmt.Sprintf("failover from %s (fenced)", lost)})
	if err == nil && ok {
		*loads = append(*loads, Load{Request: RequestOf(&f.VM), Host: target})
		s.log().Info("failover", "vm", name, "from", lost, "to", target)
	}
	return err
}

// LocalDisk names the first writable disk a failover could not take along
// (anything but RBD, which vmsup fences); "" if there is none. Read-only
// CD-ROMs and seeds are rebuilt or found on any host.
func LocalDisk(vm *spec.VM) string {
	for _, d := range vm.Disks {
		if d.ReadOnly || d.Type == spec.DiskRBD {
			continue
		}
		if d.Type == spec.DiskISCSI {
			return fmt.Sprintf("disk %s is iSCSI, which vmsup cannot fence", d.Name)
		}
		return fmt.Sprintf("disk %s is a %s on the host's own storage", d.Name, d.Type)
	}
	return ""
}
