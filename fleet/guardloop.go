package fleet

import (
	"context"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// guardSlack is how long after the agent's last moment to decide (its
// fence point plus decisionBound) the guard fires: the agent, if it runs,
// has fenced itself by then. With the default margin of 3 s the guard
// fires at 8.25 s of a 10 s lease, 1.75 s before it can lapse.
const guardSlack = 250 * time.Millisecond

// guardMove is how far the deadline must move before the guard is moved:
// renewals move it every TTL/3, holds every half second.
const guardMove = 200 * time.Millisecond

// guardDeadline is when the guard must fire if the lease is not renewed
// (nor the fence held off) after the last renewal.
func (a *Agent) guardDeadline() time.Time {
	_, last := a.lease.get()
	return last.Add(a.TTL - a.SelfFenceMargin + decisionBound + guardSlack)
}

// guardUnits are the units of the VMs this host runs or is about to run
// for the fleet: those it manages (marked before they start) and those a
// drain moves here (their QEMU starts with the migration), each under
// either of its unit names.
func (a *Agent) guardUnits() ([]string, error) {
	vms, err := a.managed()
	if err != nil {
		return nil, err
	}
	var units []string
	for _, vm := range append(vms, a.known.incomingVMs()...) {
		u := vmstore.UnitName(vm)
		units = append(units, u, vmstore.AltUnit(vm, u))
	}
	slices.Sort(units)
	return slices.Compact(units), nil
}

// armGuard moves the guard to the current deadline and units, if either
// changed. A fenced agent leaves it: its VMs are dead, and the guard
// armed before covers any it might still start.
func (a *Agent) armGuard(ctx context.Context) error {
	if a.Guard == nil || a.isFenced() {
		return nil
	}
	units, err := a.guardUnits()
	if err != nil {
		return err
	}
	deadline := a.guardDeadline()
	cur, curUnits := a.Guard.Armed()
	if slices.Equal(units, curUnits) && (len(units) == 0 || deadline.Sub(cur).Abs() < guardMove) {
		return nil
	}
	return a.Guard.Arm(ctx, deadline, units)
}

// guardLoop keeps the guard on the lease: moved after each renewal or
// hold, covering each VM the agent takes on.
func (a *Agent) guardLoop(ctx context.Context) {
	if a.Guard == nil {
		return
	}
	// Once at the start, whatever is armed: an earlier agent's timers go.
	if units, err := a.guardUnits(); err == nil && !a.isFenced() {
		if err := a.Guard.Arm(ctx, a.guardDeadline(), units); err != nil {
			a.Log.Error("guard: cannot arm it", "err", err)
		}
	}
	tick := time.NewTicker(guardMove)
	defer tick.Stop()
	var failing bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := a.armGuard(ctx)
		switch {
		case err != nil && !failing:
			a.Log.Error("guard: cannot move it; it fires at its last deadline", "err", err)
		case err == nil && failing:
			a.Log.Info("guard: moved again")
		}
		failing = err != nil
	}
}
