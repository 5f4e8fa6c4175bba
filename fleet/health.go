package fleet

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/supervisor"
)

// The agent's check of its running VMs' disk I/O: each second a sample of
// each (Supervisor.DiskIO), judged by the VM's own iohealth.Detector. A
// verdict that changes is recorded in the VM's history (vmsup events:
// degraded, recovered) and wakes reconcile, which reports the VM degraded
// in its status (fleet ls) or running again.

// ioSampleTimeout bounds one VM's sample: a monitor another command holds
// must not hold the others' checks.
const ioSampleTimeout = 2 * time.Second

// health holds the detectors and their last verdicts, by VM.
type health struct {
	bound   time.Duration
	mu      sync.Mutex
	det     map[string]*iohealth.Detector
	verdict map[string]iohealth.Health
}

// of is the VM's last verdict (OK when there is none).
func (h *health) of(vm string) iohealth.Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	if v, ok := h.verdict[vm]; ok {
		return v
	}
	return iohealth.Health{State: iohealth.OK}
}

// observe judges a sample of vm; it returns the verdict before and now.
func (h *health) observe(vm string, s iohealth.Sample) (before, now iohealth.Health) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.det == nil {
		h.det, h.verdict = map[string]*iohealth.Detector{}, map[string]iohealth.Health{}
	}
	d := h.det[vm]
	if d == nil {
		d = &iohealth.Detector{Bound: h.bound}
		h.det[vm] = d
	}
	before = h.verdict[vm]
	now = d.Observe(s)
	h.verdict[vm] = now
	return before, now
}

// forget drops what is known of vm (it no longer runs here).
func (h *health) forget(vm string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.det, vm)
	delete(h.verdict, vm)
}

// keepOnly forgets every VM not in vms.
func (h *health) keepOnly(vms []string) {
	keep := map[string]bool{}
	for _, vm := range vms {
		keep[vm] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for vm := range h.det {
		if !keep[vm] {
			delete(h.det, vm)
			delete(h.verdict, vm)
		}
	}
}

// healthLoop checks the VMs' disk I/O every second until ctx ends.
func (a *Agent) healthLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !a.isFenced() {
			a.checkIO(ctx)
		}
	}
}

// checkIO samples each VM this host runs for the fleet once, one after
// another (a sample is a few QMP queries).
func (a *Agent) checkIO(ctx context.Context) {
	vms, err := a.managed()
	if err != nil {
		return
	}
	a.health.keepOnly(vms)
	changed := false
	for _, vm := range vms {
		sctx, cancel := context.WithTimeout(ctx, ioSampleTimeout)
		s, err := a.Sup.DiskIO(sctx, vm)
		cancel()
		if errors.Is(err, supervisor.ErrNotFound) || errors.Is(err, supervisor.ErrNotRunning) {
			a.health.forget(vm)
			continue
		}
		if err != nil {
			continue // no sample (a busy monitor): the verdict stands
		}
		before, now := a.health.observe(vm, s)
		if before.State == now.State {
			continue
		}
		changed = true
		event, reason := supervisor.EventDegraded, now.Reason
		if now.State == iohealth.OK {
			event, reason = supervisor.EventRecovered, "disk I/O back: "+before.Reason
			a.Log.Info("disk I/O back", "vm", vm)
		} else {
			a.Log.Warn("disk I/O "+now.State.String(), "vm", vm, "reason", now.Reason)
		}
		if err := a.Sup.RecordEvent(vm, event, reason); err != nil {
			a.Log.Warn("event history", "vm", vm, "err", err)
		}
	}
	if changed {
		select {
		case a.poke <- struct{}{}:
		default:
		}
	}
}

// withHealth is st as the fleet reports it: a running VM whose disk I/O
// stalls or fails is degraded, with the check's reason.
func (a *Agent) withHealth(vm string, st Status) Status {
	if st.State != StateRunning {
		return st
	}
	if h := a.health.of(vm); h.State != iohealth.OK {
		st.State, st.Reason, st.IO = StateDegraded, h.Reason, h.State
	}
	return st
}
