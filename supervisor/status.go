package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/machine"
	vmstatus "github.com/vmsup/vmsup/internal/observe/status"
	"github.com/vmsup/vmsup/spec"
)

// A VM's status (vmsup status, ls) is read in internal/observe/status; here
// is the library's API.

// State is a VM's state as vmsup reports it.
type State = vmstatus.State

// VM states. Running, Paused and Panicked come from QMP, the others from
// systemd.
const (
	StateRunning  = vmstatus.StateRunning
	StatePaused   = vmstatus.StatePaused
	StateShutOff  = vmstatus.StateShutOff  // no unit; the VM's state directory exists
	StateCrashed  = vmstatus.StateCrashed  // the unit failed: QEMU died abnormally
	StateStarting = vmstatus.StateStarting // the unit starts, or QEMU has not opened its monitor yet
	StateStopping = vmstatus.StateStopping
	StateUnknown  = vmstatus.StateUnknown // unit active but QEMU does not answer
	// StatePanicked is a guest stopped by its panic (on_panic "pause" or
	// "preserve"): QEMU runs, the guest does not.
	StatePanicked = vmstatus.StatePanicked
)

// What status reports of a VM (vmstatus).
type (
	Status           = vmstatus.Status
	SecureBootStatus = vmstatus.SecureBootStatus
	HostDevInfo      = vmstatus.HostDevInfo
	DiskInfo         = vmstatus.DiskInfo
	NICInfo          = vmstatus.NICInfo
)

// Sync states: whether a running VM matches its file.
const (
	SyncInSync  = vmstatus.SyncInSync
	SyncChanged = vmstatus.SyncChanged
	SyncNoFile  = vmstatus.SyncNoFile
)

// Status reports the VM's state from systemd and, while it runs, QMP.
func (s *Supervisor) Status(ctx context.Context, name string) (Status, error) {
	return s.status(ctx, name, true)
}

// status is Status; detail says whether to measure the unit's exposure (a
// systemd-analyze run) and ping the guest agent, both left out of List.
func (s *Supervisor) status(ctx context.Context, name string, detail bool) (Status, error) {
	return s.statusReader().Status(ctx, name, detail)
}

// List reports every VM vmsup knows: those with a state directory and those
// with a vmsup unit (even if their directory is gone).
func (s *Supervisor) List(ctx context.Context) ([]Status, error) { return s.statusReader().List(ctx) }

// Names lists the VMs vmsup has a state directory for, without asking
// systemd (shell completion).
func (s *Supervisor) Names() ([]string, error) { return s.env.State().Known() }

func (s *Supervisor) statusReader() *vmstatus.Reader {
	return vmstatus.New(s.env, vmstatus.Options{StartGrace: machine.ConfirmTimeout(spec.AccelTCG)})
}
