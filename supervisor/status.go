package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/net/nics"
	vmstatus "github.com/vmsup/vmsup/internal/observe/status"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// A VM's status (vmsup status, ls) is read in internal/observe/status; here are
// its Host and the library's API.

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
	return vmstatus.New(statusHost{s}, vmstatus.Options{StartGrace: machine.ConfirmTimeout(spec.AccelTCG)})
}

// statusHost is status's Host.
type statusHost struct{ s *Supervisor }

var _ vmstatus.Host = statusHost{}

func (h statusHost) State() vmstore.Store                    { return h.s.env.State() }
func (h statusHost) View(name string) (*vmstore.View, error) { return h.s.env.State().View(name) }
func (h statusHost) Systemd(ctx context.Context) (vmstatus.Systemd, error) {
	sd, err := h.s.env.Systemd(ctx)
	if err != nil {
		return nil, err
	}
	return sd, nil
}
func (h statusHost) Settle(ctx context.Context, name string) (string, error) {
	return h.s.env.Ops().SettleIfFree(ctx, name)
}
func (h statusHost) Monitor(ctx context.Context, name string) (vmstatus.Monitor, func(), error) {
	c, release, err := h.s.env.QMPSession(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return statusMonitor{c, h.s, name}, release, nil
}
func (h statusHost) GuestPing(ctx context.Context, name string) (AgentStatus, error) {
	return h.s.GuestPing(ctx, name)
}
func (h statusHost) Enabled(name string) bool { return h.s.env.AutostartMarks().IsEnabled(name) }
func (h statusHost) NICs(ctx context.Context, name string) []nics.NICStatus {
	return h.s.env.NICStatuses(ctx, name)
}
func (h statusHost) Confinement(ctx context.Context, name, unit string, mainPID uint32, detail bool) *confine.Status {
	sd, err := h.s.env.Systemd(ctx) // the connection Systemd made
	if err != nil {
		return nil
	}
	return h.s.env.ConfinementStatus(ctx, sd, name, unit, mainPID, detail)
}
func (h statusHost) EndedReason(name string) string { return h.s.env.EndedReason(name) }
func (h statusHost) NotFound(name string) error     { return h.s.env.NotFound(name) }
func (h statusHost) RunsFile(app *vmstore.Applied, vm *spec.VM) bool {
	return machine.RunsFile(app, vm)
}

// statusMonitor is status's QMP session: the agent's ping goes over it.
type statusMonitor struct {
	*qmp.Conn
	s    *Supervisor
	name string
}

func (m statusMonitor) PingAgent(ctx context.Context) (AgentStatus, error) {
	return m.s.env.Guest().PingOn(ctx, m.name, m.Conn)
}
