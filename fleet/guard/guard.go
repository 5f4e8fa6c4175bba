// Package guard is a fleet host's fence that outlives its agent: a
// systemd timer, armed by the agent for its fence point and moved forward
// at each renewal of its lease, whose service kills the host's fleet VMs
// (SIGKILL to their units, by systemctl) when it fires. systemd (PID 1)
// keeps the timer, so a frozen, crashed, stopped or hung agent still loses
// its VMs before its lease can lapse and the scheduler restarts them on
// another host.
//
// Each arming is a new transient timer (a unit's properties cannot change
// while it runs): the new one is started before the old one is stopped,
// so a host is never without a guard while it has VMs. Nothing is written
// to disk: a new agent finds an earlier agent's timers by name and stops
// them once its own is armed.
//
// The package owns the timers; the agent owns when and what they kill.
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	sd "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Systemd is what the guard asks of the host's systemd (a go-systemd
// *dbus.Conn has it).
type Systemd interface {
	StartTransientUnitAux(ctx context.Context, name, mode string, props []sd.Property, aux []sd.PropertyCollection, ch chan<- string) (int, error)
	StopUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	ListUnitsByPatternsContext(ctx context.Context, states, patterns []string) ([]sd.UnitStatus, error)
}

var _ Systemd = (*sd.Conn)(nil)

// Guard arms and moves one host's timer. It is safe for concurrent use.
type Guard struct {
	SD Systemd
	// Prefix names the timers (PREFIX-TOKEN-N.timer and .service); one per
	// host's systemd, e.g. "vmsup-fleet-guard".
	Prefix string
	// Systemctl is the systemctl the service runs (an absolute path).
	Systemctl string
	Log       *slog.Logger

	mu       sync.Mutex
	token    string // this Guard's part of its timers' names
	seq      int
	armed    string // the timer armed now; "" none
	deadline time.Time
	units    []string
	swept    bool // an earlier agent's timers stopped
}

// callTimeout bounds each call to systemd: a guard that cannot be moved
// fires at its old deadline, which is safe; one that hangs its caller is
// not.
const callTimeout = 2 * time.Second

// Arm makes the guard kill units (the VMs' unit names) at deadline,
// replacing what was armed before; with no units it disarms. On error
// what was armed before stays armed.
func (g *Guard) Arm(ctx context.Context, deadline time.Time, units []string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	units = slices.Sorted(slices.Values(units))
	if len(units) == 0 {
		err := g.stopAll(ctx, "")
		if err == nil {
			g.armed, g.units, g.deadline = "", nil, time.Time{}
		}
		return err
	}
	if g.token == "" {
		g.token = fmt.Sprint(time.Now().UnixNano())
	}
	g.seq++
	name := fmt.Sprintf("%s-%s-%d", g.Prefix, g.token, g.seq)
	if err := g.start(ctx, name, deadline, units); err != nil {
		return err
	}
	old := g.armed
	g.armed, g.deadline, g.units = name+".timer", deadline, units
	if !g.swept {
		if err := g.stopAll(ctx, g.armed); err != nil {
			return err
		}
		g.swept = true
	} else if old != "" {
		if err := g.stop(ctx, old); err != nil {
			g.swept = false // the next arming stops it, with any other
			return err
		}
	}
	return nil
}

// Armed is the deadline and units armed now (zero and nil: none).
func (g *Guard) Armed() (time.Time, []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.deadline, slices.Clone(g.units)
}

// start starts the timer NAME.timer for deadline and its service NAME.service.
func (g *Guard) start(ctx context.Context, name string, deadline time.Time, units []string) error {
	after := max(time.Until(deadline), time.Millisecond)
	timer := []sd.Property{
		sd.PropDescription("vmsup fleet guard: kill this host's fleet VMs unless the agent renews its lease"),
		{Name: "TimersMonotonic", Value: godbus.MakeVariant([]struct {
			Base string
			USec uint64
		}{{"OnActiveSec", uint64(after / time.Microsecond)}})},
		{Name: "AccuracyUSec", Value: godbus.MakeVariant(uint64(time.Millisecond / time.Microsecond))},
		{Name: "RemainAfterElapse", Value: godbus.MakeVariant(false)},
	}
	service := []sd.Property{
		sd.PropDescription("vmsup fleet guard: the agent did not renew its lease in time; kill " + strings.Join(units, " ")),
		// Units that are not loaded (a VM not running, its other unit
		// name) are reported and skipped; the others are killed.
		sd.PropExecStart(append([]string{g.Systemctl, "kill", "--signal=SIGKILL", "--kill-whom=all"}, units...), false),
		{Name: "CollectMode", Value: godbus.MakeVariant("inactive-or-failed")},
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	ch := make(chan string, 1)
	if _, err := g.SD.StartTransientUnitAux(cctx, name+".timer", "replace", timer,
		[]sd.PropertyCollection{{Name: name + ".service", Properties: service}}, ch); err != nil {
		return fmt.Errorf("guard %s: %w", name, err)
	}
	select {
	case r := <-ch:
		if r != "done" {
			return fmt.Errorf("guard %s: start job %s", name, r)
		}
	case <-cctx.Done():
		return fmt.Errorf("guard %s: start job: %w", name, cctx.Err())
	}
	g.log().Debug("guard armed", "timer", name, "in", after.Round(time.Millisecond), "units", units)
	return nil
}

// stopAll stops every guard timer of this prefix but keep.
func (g *Guard) stopAll(ctx context.Context, keep string) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	us, err := g.SD.ListUnitsByPatternsContext(cctx, nil, []string{g.Prefix + "-*.timer"})
	if err != nil {
		return fmt.Errorf("guard: list timers: %w", err)
	}
	var errs []error
	for _, u := range us {
		if u.Name != keep {
			errs = append(errs, g.stop(ctx, u.Name))
		}
	}
	return errors.Join(errs...)
}

// stop stops one timer (its service goes with it, unless it fired and
// runs); one already gone is no error.
func (g *Guard) stop(ctx context.Context, timer string) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	ch := make(chan string, 1)
	if _, err := g.SD.StopUnitContext(cctx, timer, "replace", ch); err != nil {
		var e godbus.Error
		if errors.As(err, &e) && e.Name == "org.freedesktop.systemd1.NoSuchUnit" {
			return nil
		}
		return fmt.Errorf("guard: stop %s: %w", timer, err)
	}
	select {
	case <-ch:
	case <-cctx.Done():
		return fmt.Errorf("guard: stop %s: %w", timer, cctx.Err())
	}
	return nil
}

func (g *Guard) log() *slog.Logger {
	if g.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return g.Log
}
