package spec

import "time"

// Health is the gate a restart must pass (vmsup apply --restart, up
// --restart-changed): the new QEMU runs, and then every check configured
// here passes within Timeout; otherwise the previous spec is started again.
type Health struct {
	// Agent: the guest agent must answer. Unset: checked when the agent
	// answered before the restart (a guest that had one must keep it).
	Agent *bool `toml:"agent"`
	// Console: this text must appear on the serial console (a line the
	// guest prints once its services are up).
	Console string `toml:"console"`
	// Timeout bounds the wait for all checks (the guest's boot). Unset,
	// it is sized when the restart runs: DefaultHealthTimeout under KVM,
	// DefaultTCGHealthTimeout under TCG, stretched by the host's load
	// (hostcaps.HealthTimeout).
	Timeout Duration `toml:"timeout"`
}

// Health defaults and bounds.
const (
	DefaultHealthTimeout = 120 * time.Second
	// DefaultTCGHealthTimeout: a distribution's boot under TCG takes
	// minutes (a Debian guest's took more than 2).
	DefaultTCGHealthTimeout = 10 * time.Minute
	MaxHealthTimeout        = time.Hour
	MaxHealthMarker         = 256
)

func (f *File) validateHealth() error {
	h := f.VM.Health
	if h.Timeout < 0 || h.Timeout.D() > MaxHealthTimeout {
		return f.Errorf("health.timeout", "%s is out of range (0, %s]", h.Timeout.D(), MaxHealthTimeout)
	}
	if len(h.Console) > MaxHealthMarker {
		return f.Errorf("health.console", "longer than %d bytes", MaxHealthMarker)
	}
	for _, r := range h.Console {
		if r == '\n' || r == '\r' || r == 0 {
			return f.Errorf("health.console", "the marker is one line: no newline or NUL")
		}
	}
	if h.Agent != nil && *h.Agent && !f.VM.HasGuestAgent() {
		return f.Errorf("health.agent", "needs the guest agent channel (guest_agent = false)")
	}
	return nil
}
