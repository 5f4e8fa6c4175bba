package vmstore

import "strings"

// State is a VM's state as vmsup reports it (status, up's result).
type State string

// MarshalText writes a state without spaces, as in QEMU's own names:
// "shut off" is "shut-off" in JSON (vmsup status --json and the remote API).
func (s State) MarshalText() ([]byte, error) {
	return []byte(strings.ReplaceAll(string(s), " ", "-")), nil
}

// UnmarshalText reads a state MarshalText wrote.
func (s *State) UnmarshalText(b []byte) error {
	*s = State(strings.ReplaceAll(string(b), "-", " "))
	return nil
}

// VM states. Running, Paused and Panicked come from QMP, the others from
// systemd.
const (
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateShutOff  State = "shut off" // no unit; the VM's state directory exists
	StateCrashed  State = "crashed"  // the unit failed: QEMU died abnormally
	StateStarting State = "starting"
	StateStopping State = "stopping"
	StateUnknown  State = "unknown" // unit active but QEMU does not answer
	// StatePanicked is a guest stopped by its panic (on_panic "pause" or
	// "preserve"): QEMU runs, the guest does not.
	StatePanicked State = "panicked"
)
