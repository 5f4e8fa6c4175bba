package fleet

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/spec"
)

// stalledLongEnough reports whether the VM's live host has reported its
// disk I/O stalled for FailoverStalled (a status is written when it
// changes, so its time is when the stall was first reported).
func (s *Scheduler) stalledLongEnough(st Status, host string) bool {
	return s.FailoverStalled > 0 && st.Host == host && st.State == StateDegraded && st.IO == iohealth.Stalled &&
		time.Since(st.Updated) >= s.FailoverStalled
}

// evacuate restarts elsewhere a VM whose disk I/O has stalled on its host
// (the operator's choice, FailoverStalled): like a failover, only with
// fenceable disks and only after fencing that host from them (its QEMU
// would write again when the storage came back), then the placement
// moves and the host's agent kills its copy. A VM that cannot move stays
// as it is, degraded.
func (s *Scheduler) evacuate(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], p Entry[Placement], f *spec.File, hosts []Host, loads *[]Load) error {
	name, from := rec.Value.Name, p.Value.Host
	if LocalDisk(&f.VM) != "" || s.Fence == nil {
		return nil
	}
	target, err := Choose(RequestOfRecord(rec.Value, &f.VM), hosts, *loads, from)
	if err != nil {
		return nil // nowhere to go: it stays, degraded
	}
	if ok, err := s.Store.cas(ctx, nil, s.guard); err != nil || !ok {
		return errors.Join(err, errNotLeader)
	}
	stalled := snap.Statuses[name].Value
	if err := s.Fence.Fence(ctx, from, &f.VM); err != nil {
		return fmt.Errorf("vm %s: its disk I/O stalled on %s; fencing it failed, so not moved: %w", name, from, err)
	}
	next := Placement{Host: target, Epoch: p.Value.Epoch + 1}
	ok, err := s.Store.movePlacement(ctx, name, p.Rev, next, &Status{Host: target, State: StatePending,
		Reason: fmt.Sprintf("moved from %s (fenced): %s", from, stalled.Reason)}, s.guard)
	if err != nil || !ok {
		return cmp.Or(err, errRaced)
	}
	*loads = append(*loads, Load{Request: RequestOf(&f.VM), Host: target})
	s.log().Info("moved: disk I/O stalled", "vm", name, "from", from, "to", target, "since", stalled.Updated)
	return nil
}
