package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// reconcile brings this host's VMs to what the fleet says, from a
// linearizable read only: with no quorum it does nothing, and the VMs run
// on untouched.
func (a *Agent) reconcile(ctx context.Context) error {
	snap, err := a.Store.Load(ctx, false)
	if err != nil {
		return err
	}
	me := a.Host.Name
	a.learn(snap)
	var errs []error
	names := make([]string, 0, len(snap.Placements))
	for name := range snap.Placements {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p := snap.Placements[name]
		rec, ok := snap.VMs[name]
		switch {
		case !ok:
		case p.Value.Host == me && p.Value.Target == "":
			errs = append(errs, a.ensure(ctx, snap, rec))
		case p.Value.Host == me:
			errs = append(errs, a.moveOut(ctx, snap, rec, p))
		case p.Value.Target == me:
			a.prepareMoveIn(ctx, rec.Value)
			errs = append(errs, a.finishMoveIn(ctx, snap, rec, p))
		}
	}
	managed, err := a.managed()
	if err != nil {
		return err
	}
	for _, name := range managed {
		p, placed := snap.Placements[name]
		if placed && (p.Value.Host == me || p.Value.Target == me) {
			continue
		}
		errs = append(errs, a.release(ctx, name, placed))
	}
	return errors.Join(errs...)
}

// ensure keeps one VM placed here running at its spec's generation.
func (a *Agent) ensure(ctx context.Context, snap *Snapshot, rec Entry[VMRecord]) error {
	name, gen := rec.Value.Name, rec.Value.Generation
	f, err := spec.Parse(rec.Value.File, []byte(rec.Value.TOML))
	if err == nil {
		// Whoever wrote the spec to etcd, its paths must be in this
		// host's places; nothing is started, adopted or applied before.
		err = a.Sup.CheckPaths(ctx, f)
	}
	if err != nil {
		return a.report(ctx, snap, name, Status{State: StateInvalid, Reason: err.Error()})
	}
	applied, managed := a.applied(name)
	if !managed {
		if err := a.mark(name, 0); err != nil { // before Up: a crash after it still knows the VM
			return err
		}
	}
	st, err := a.Sup.Status(ctx, name)
	if !managed && err == nil && (st.State == supervisor.StateRunning || st.State == supervisor.StatePaused) {
		// Come here running (a drain's migration, or marks lost): if it
		// runs its spec, it is at this generation; nothing to apply.
		if p, perr := a.Sup.PlanWith(ctx, f, supervisor.PlanOptions{Adopt: true}); perr == nil && len(p.Changes) == 0 {
			applied = gen
			if err := a.mark(name, gen); err != nil {
				return err
			}
		}
	}
	down := errors.Is(err, supervisor.ErrNotFound) || (err == nil && (st.State == supervisor.StateShutOff || st.State == supervisor.StateCrashed))
	switch {
	case err != nil && !down:
		return a.report(ctx, snap, name, Status{State: StateUnknown, Reason: err.Error()})
	case down && !a.retry.ready(name):
		return nil // its status still says why it failed
	case down:
		if err := a.ensureImages(ctx, rec.Value); err != nil {
			d := a.retry.failed(name)
			return a.report(ctx, snap, name, Status{State: StateFailed, Reason: fmt.Sprintf("not started: %v (next try in %s)", err, d), Generation: applied})
		}
		// Its QEMU is covered by the guard before it exists.
		if err := a.armGuard(ctx); err != nil {
			a.retry.failed(name)
			return a.report(ctx, snap, name, Status{State: StateFailed, Reason: "not started: " + err.Error(), Generation: applied})
		}
		t0 := time.Now()
		if _, err := a.Sup.UpWith(ctx, supervisor.UpOptions{Adopt: true}, f); err != nil {
			d := a.retry.failed(name)
			return a.report(ctx, snap, name, Status{State: StateFailed, Reason: fmt.Sprintf("%v (next try in %s)", err, d), Generation: applied})
		}
		a.retry.succeeded(name)
		a.Log.Info("started", "vm", name, "generation", gen, "took", time.Since(t0).Round(time.Millisecond))
		applied = gen
		if err := a.mark(name, gen); err != nil {
			return err
		}
	case applied != gen && (st.State == supervisor.StateRunning || st.State == supervisor.StatePaused) && a.retry.ready(name):
		if _, err := a.Sup.Apply(ctx, f, supervisor.ApplyOptions{Adopt: true}); err != nil {
			a.retry.failed(name)
			return a.report(ctx, snap, name, Status{State: State(st.State), Reason: fmt.Sprintf("generation %d not applied: %v", gen, err), Generation: applied})
		}
		a.retry.succeeded(name)
		applied = gen
		if err := a.mark(name, gen); err != nil {
			return err
		}
	}
	if st, err = a.Sup.Status(ctx, name); err != nil {
		return err
	}
	return a.report(ctx, snap, name, a.withHealth(name, Status{State: State(st.State), Reason: st.Reason, Generation: applied}))
}

// moveOut live-migrates a VM a drain moves to its target, then hands the
// placement over (or the target's agent does, if this one dies first).
func (a *Agent) moveOut(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], p Entry[Placement]) error {
	name, target := rec.Value.Name, p.Value.Target
	h, ok := snap.Hosts[target]
	if !ok || !a.retry.ready(name) {
		return nil
	}
	st, err := a.Sup.Status(ctx, name)
	if errors.Is(err, supervisor.ErrNotFound) {
		return nil // moved already: the target's agent takes the placement over
	}
	if err != nil {
		return err
	}
	if st.State != supervisor.StateRunning && st.State != supervisor.StatePaused {
		if hostDisks(rec.Value) != "" {
			return a.moveShutOff(ctx, snap, rec, p, h, State(st.State))
		}
		// Nothing to migrate live, no disk here: it starts on the target
		// from its spec.
		if _, err := a.Sup.RemoveVM(ctx, name); err != nil {
			return err
		}
		return a.handOver(ctx, name, p, Status{Host: target, State: StatePending, Reason: "moved stopped by a drain"})
	}
	o := a.moveOptions(target, h)
	switch why, err := a.targetImages(rec.Value, h); {
	case err != nil:
		return a.migrationFailed(ctx, snap, name, p, err)
	case why != "":
		return a.report(ctx, snap, name, Status{State: State(st.State), Reason: why})
	}
	a.Log.Info("drain: migrating", "vm", name, "to", target)
	res, err := a.Sup.Migrate(ctx, name, o)
	if err != nil {
		return a.migrationFailed(ctx, snap, name, p, err)
	}
	a.retry.succeeded(name)
	// disks > 0: local disks were copied (storage migration); the source
	// removed its images of them.
	a.Log.Info("drain: migrated", "vm", name, "to", target, "took", res.TotalTime, "disks", res.Disks, "disk_bytes", res.DiskTransferred)
	return a.handOver(ctx, name, p, Status{Host: target, State: StateRunning, Reason: "migrated by a drain", Generation: rec.Value.Generation})
}

// moveOptions are a drain's migration or move options to target h.
func (a *Agent) moveOptions(target string, h Host) supervisor.MigrateOptions {
	o := supervisor.MigrateOptions{To: target, Address: h.Migration.Address, Transport: h.Migration.Transport}
	if len(o.Transport) == 0 && h.Migration.Receiver != "" && a.Connect != nil {
		o.Transport = a.Connect(h.Migration.Receiver)
	}
	return o
}

// moveShutOff moves a VM a drain found shut off on this host's own disks
// to its target with them (vmsup move: the disks copied, the VM defined
// there and forgotten here), then hands the placement over; started from
// its spec on the target instead, it would come up on new, empty disks. A
// move that fails leaves it here, its status saying why, and is tried
// again spaced; the host uncordoned first, the target is dropped and it
// runs here again.
func (a *Agent) moveShutOff(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], p Entry[Placement], h Host, state State) error {
	name, target := rec.Value.Name, p.Value.Target
	if !snap.Cordoned[a.Host.Name] {
		next := p.Value
		next.Target = ""
		_, err := a.Store.movePlacement(ctx, name, p.Rev, next, nil, nil)
		return err
	}
	switch why, err := a.targetImages(rec.Value, h); {
	case err != nil:
		return a.migrationFailed(ctx, snap, name, p, err)
	case why != "":
		return a.report(ctx, snap, name, Status{State: state, Reason: why})
	}
	a.Log.Info("drain: moving shut off with its disks", "vm", name, "to", target)
	res, err := a.Sup.Move(ctx, name, a.moveOptions(target, h))
	if err != nil {
		return a.migrationFailed(ctx, snap, name, p, err)
	}
	a.retry.succeeded(name)
	a.Log.Info("drain: moved", "vm", name, "to", target, "took", res.TotalTime, "disks", res.Disks, "disk_bytes", res.DiskTransferred)
	return a.handOver(ctx, name, p, Status{Host: target, State: StatePending, Reason: "moved shut off by a drain, its disks copied"})
}

// hostDisks names the first writable disk on the host's own storage (a
// file or a block device) rec's VM has; "" if none or its spec does not
// parse (then the target refuses it as well).
func hostDisks(rec VMRecord) string {
	f, err := spec.Parse(rec.File, []byte(rec.TOML))
	if err != nil {
		return ""
	}
	for _, d := range f.VM.Disks {
		if !d.ReadOnly && (d.Type == spec.DiskFile || d.Type == spec.DiskBlock) {
			return fmt.Sprintf("disk %s is a %s", d.Name, d.Type)
		}
	}
	return ""
}

// migrationFailed spaces the next try (retries) and, if the guest still
// runs here, hands the choice of a target back to the scheduler, which
// picks another host if one fits: a target agent that died, or a host
// that cannot take the VM, does not hold the drain up. A guest that no
// longer runs here may run on the target (the stream ended, the answer
// was lost): that target's agent takes the placement over.
func (a *Agent) migrationFailed(ctx context.Context, snap *Snapshot, name string, p Entry[Placement], merr error) error {
	target := p.Value.Target
	d := a.retry.failed(name)
	a.Log.Warn("drain: migration failed", "vm", name, "to", target, "next try in", d, "err", merr)
	st, err := a.Sup.Status(ctx, name)
	if err != nil || st.State != supervisor.StateRunning || qmp.RunState(st.QEMUStatus) != qmp.RunRunning {
		return a.report(ctx, snap, name, Status{State: State(st.State), Reason: fmt.Sprintf("drain: migration to %s failed (next try in %s): %v", target, d, merr)})
	}
	next := p.Value
	next.Target = ""
	if !slices.Contains(next.FailedTargets, target) {
		next.FailedTargets = append(slices.Clone(next.FailedTargets), target)
	}
	_, err = a.Store.movePlacement(ctx, name, p.Rev, next, &Status{Host: a.Host.Name, State: State(st.State),
		Reason: fmt.Sprintf("drain: migration to %s failed (next try in %s, to another host if one fits): %v", target, d, merr)}, nil)
	return err
}

// handOver gives the placement to its target and forgets the VM here.
func (a *Agent) handOver(ctx context.Context, name string, p Entry[Placement], st Status) error {
	ok, err := a.Store.movePlacement(ctx, name, p.Rev, Placement{Host: p.Value.Target, Epoch: p.Value.Epoch + 1}, &st, nil)
	if err != nil {
		return err
	}
	if ok {
		return a.unmark(name)
	}
	return nil // the target's agent was first
}

// finishMoveIn takes over the placement of a VM that a drain's migration
// brought here, if the source's agent did not live to do it.
func (a *Agent) finishMoveIn(ctx context.Context, snap *Snapshot, rec Entry[VMRecord], p Entry[Placement]) error {
	// Only a guest that runs here: QEMU runs a guest only once the stream
	// is complete (an incoming one is "inmigrate"), so the source's copy
	// has stopped for good.
	st, err := a.Sup.Status(ctx, rec.Value.Name)
	if err != nil || st.State != supervisor.StateRunning || qmp.RunState(st.QEMUStatus) != qmp.RunRunning {
		return nil
	}
	ok, err := a.Store.movePlacement(ctx, rec.Value.Name, p.Rev, Placement{Host: a.Host.Name, Epoch: p.Value.Epoch + 1},
		&Status{Host: a.Host.Name, State: State(st.State), Reason: "migrated by a drain", Generation: rec.Value.Generation}, nil)
	if err == nil && ok {
		return a.mark(rec.Value.Name, rec.Value.Generation)
	}
	return err
}

// release stops a VM this host no longer owns: removed from the fleet
// (graceful down, its state removed, its status dropped) or placed
// elsewhere by a failover (killed at once: another copy may run).
func (a *Agent) release(ctx context.Context, name string, placedElsewhere bool) error {
	var err error
	if placedElsewhere {
		_, err = a.Sup.Kill(ctx, name)
	} else {
		_, err = a.Sup.Down(ctx, name)
	}
	if err != nil && !errors.Is(err, supervisor.ErrNotFound) && !errors.Is(err, supervisor.ErrNotRunning) {
		return err
	}
	if _, err := a.Sup.RemoveVM(ctx, name); err != nil && !errors.Is(err, supervisor.ErrNotFound) {
		return err
	}
	if !placedElsewhere {
		if err := a.Store.deleteStatus(ctx, name); err != nil {
			return err
		}
	}
	a.Log.Info("released", "vm", name, "placed elsewhere", placedElsewhere)
	return a.unmark(name)
}

// report writes the VM's status unless it says what is stored already.
func (a *Agent) report(ctx context.Context, snap *Snapshot, name string, st Status) error {
	st.Host = a.Host.Name
	if cur, ok := snap.Statuses[name]; ok {
		c := cur.Value
		if c.Host == st.Host && c.State == st.State && c.Reason == st.Reason && c.IO == st.IO && c.Generation == st.Generation {
			return nil
		}
	}
	return a.Store.PutStatus(ctx, name, st)
}

// The marks: STATE/vms/NAME holds the generation applied (0 before the
// first start).
func (a *Agent) markPath(name string) string { return filepath.Join(a.State, "vms", name) }

func (a *Agent) mark(name string, gen int64) error {
	if err := os.MkdirAll(filepath.Dir(a.markPath(name)), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(a.markPath(name), []byte(strconv.FormatInt(gen, 10)+"\n"), 0o600)
}

func (a *Agent) unmark(name string) error {
	if err := os.Remove(a.markPath(name)); err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

func (a *Agent) applied(name string) (gen int64, ok bool) {
	b, err := os.ReadFile(a.markPath(name))
	if err != nil {
		return 0, false
	}
	gen, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return gen, true
}
