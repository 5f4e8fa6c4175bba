package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/ovmfvars"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/internal/vmstats"
	"github.com/vmsup/vmsup/spec"
)

// State is a VM's state as vmsup reports it.
type State string

// VM states. Running and Paused come from QMP, the others from systemd.
const (
	StateRunning  State = "running"
	StatePaused   State = "paused"
	StateShutOff  State = vmstats.StateShutOff // no unit; the VM's state directory exists
	StateCrashed  State = vmstats.StateCrashed // the unit failed: QEMU died abnormally
	StateStarting State = "starting"
	StateStopping State = "stopping"
	StateUnknown  State = vmstats.StateUnknown // unit active but QEMU does not answer
)

// Status is what vmsup knows about one VM.
type Status struct {
	Name        string     `json:"name"`
	State       State      `json:"state"`
	Reason      string     `json:"reason,omitempty"` // why crashed/unknown
	QEMUStatus  string     `json:"qemu_status,omitempty"`
	Unit        string     `json:"unit"`
	UnitState   string     `json:"unit_state,omitempty"` // ActiveState/SubState
	MainPID     uint32     `json:"main_pid,omitempty"`
	Since       *time.Time `json:"since,omitempty"`
	Accel       spec.Accel `json:"accel,omitempty"`
	AccelReason string     `json:"accel_reason,omitempty"`
	// CPUModel is the -cpu model the VM runs with; CPUMasks the features
	// turned off because this host's KVM refuses the model otherwise.
	CPUModel string   `json:"cpu_model,omitempty"`
	CPUMasks []string `json:"cpu_masks,omitempty"`
	UUID     string   `json:"uuid,omitempty"`      // the machine UUID the guest sees (recorded at its first start)
	VsockCID uint32   `json:"vsock_cid,omitempty"` // the guest's vsock CID ([vsock]), kept until rm
	// SecureBoot is what a UEFI VM's own variable store holds: whether
	// Secure Boot is enforced, the enrolled keys' certificates, and a
	// warning (a db with only Microsoft's expired 2011 CAs).
	SecureBoot *SecureBootStatus `json:"secure_boot,omitempty"`
	// HostDevs are the host PCI devices passed through: the file's, and
	// those hot-plugged into this run.
	HostDevs []HostDevInfo `json:"host_devices,omitempty"`
	// Snapshots are the VM's snapshot tags, oldest first; CurrentSnapshot
	// the one its state grew from (vmsup snapshot ls shows the tree).
	Snapshots       []string `json:"snapshots,omitempty"`
	CurrentSnapshot string   `json:"current_snapshot,omitempty"`
	SpecFile        string   `json:"spec_file,omitempty"`
	CPUs            int      `json:"cpus,omitempty"`
	Memory          string   `json:"memory,omitempty"`
	MemoryUsed      uint64   `json:"memory_used_bytes,omitempty"` // the unit's cgroup
	StateDir        string   `json:"state_dir"`
	Console         string   `json:"console_socket"`
	ConsoleLog      string   `json:"console_log"` // everything the guest printed on its serial console
	Description     string   `json:"description"`
	// Disks and NICs: boot-time and hot-plugged, NICs with the host side
	// of their taps.
	Disks []DiskInfo `json:"disks"`
	NICs  []NICInfo  `json:"nics"`
	// Confinement in force while QEMU runs (user, AppArmor, seccomp, exposure).
	Confinement *Confinement `json:"confinement,omitempty"`
	// AttachedDisks are the disks added with `vmsup disk attach` (beyond the
	// VM's file); the next up boots with them.
	AttachedDisks []string `json:"attached_disks,omitempty"`
	// MovedDisks are the disks of the VM's file that `vmsup disk move` put
	// elsewhere ("data: /old.raw -> /new.qcow2"): the VM boots from the new
	// place while its file still names the old one.
	MovedDisks []string `json:"moved_disks,omitempty"`
	// Autostart: enabled to start at boot (vmsup enable).
	Autostart bool `json:"autostart,omitempty"`
	// Recovery: what this status did about an operation a killed command
	// left unfinished (or why it could not).
	Recovery string `json:"recovery,omitempty"`
	// GuestAgent: the guest ping (running VMs with an agent channel; in
	// List only when the agent answers).
	GuestAgent *AgentStatus `json:"guest_agent,omitempty"`
	// Sync says whether the running VM matches its file: "in sync",
	// "changed" (vmsup plan FILE says how), or "file unreadable".
	Sync string `json:"sync,omitempty"`
	// Generation counts the specs the VM was recorded with (each start and
	// each apply that changed it).
	Generation int `json:"generation,omitempty"`
	// Pending are the changes an apply left for a restart or, with
	// PendingAtReboot, for the guest's next reboot.
	Pending         []string `json:"pending,omitempty"`
	PendingAtReboot bool     `json:"pending_at_reboot,omitempty"`
}

// Sync states.
const (
	SyncInSync   = "in sync"
	SyncChanged  = "changed"
	SyncNoFile   = "file unreadable"
	syncNotKnown = ""
)

// fileStatus fills what status says of the VM and its file: in sync or
// not, the record's generation, what an apply left pending.
func (s *Supervisor) fileStatus(out *Status, app *vmstate.Applied) {
	out.Sync, out.Generation = s.syncOf(app), app.Generation
	if pd, err := s.state.ReadPending(out.Name); err == nil && pd != nil && out.Sync != SyncInSync {
		out.Pending, out.PendingAtReboot = pd.Changes, pd.AtReboot
	}
}

// syncOf compares the running VM of app with its file as it is now.
func (s *Supervisor) syncOf(app *vmstate.Applied) string {
	if app.SourceFile == "" {
		return syncNotKnown
	}
	f, err := spec.Load(app.SourceFile)
	if err != nil {
		return SyncNoFile
	}
	if runsFile(app, &f.VM) {
		return SyncInSync
	}
	return SyncChanged
}

// Status reports the VM's state from systemd and, while it runs, QMP.
func (s *Supervisor) Status(ctx context.Context, name string) (Status, error) {
	return s.status(ctx, name, true)
}

// status is Status; detail says whether to measure the unit's exposure (a
// systemd-analyze run) and ping the guest agent, both left out of List.
func (s *Supervisor) status(ctx context.Context, name string, detail bool) (Status, error) {
	if err := spec.ValidName(name); err != nil {
		return Status{}, vmErr(name, err)
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return Status{}, err
	}
	// What a killed command left is settled first, so that status tells
	// the truth (unless a command is at work on the VM now).
	recovered, recErr := s.recoverUnlocked(ctx, name)
	unit := s.state.UnitOf(name)
	st, err := sd.Status(ctx, unit)
	if err != nil {
		return Status{}, err
	}
	p := s.paths(name)
	out := Status{Name: name, Unit: unit, StateDir: p.Dir, Console: p.Console, ConsoleLog: p.ConsoleLog, Autostart: s.isEnabled(name)}
	out.Recovery = recovered
	if recErr != nil {
		out.Recovery = recErr.Error()
	}
	v, _ := s.state.View(name)
	s.recorded(&out, p, v)
	out.Disks, out.NICs = s.devices(ctx, name)
	if v != nil && st.Exists && st.ActiveState == "active" { // live resizes hold for this run
		out.CPUs, out.Memory = v.Spec.CPUs, v.Spec.Memory.String()
	}
	if st.Stopped() {
		if _, err := os.Stat(p.Dir); errors.Is(err, os.ErrNotExist) {
			return out, s.notFound(name)
		}
		out.State, out.Reason = StateShutOff, s.endedReason(name)
		return out, nil
	}
	out.UnitState = st.ActiveState + "/" + st.SubState
	out.MainPID = st.MainPID
	out.MemoryUsed = st.MemoryCurrent
	if !st.Since.IsZero() {
		t := st.Since
		out.Since = &t
	}
	switch st.ActiveState {
	case "failed":
		out.State, out.Reason = StateCrashed, st.ExitReason()
		return out, nil
	case "activating":
		out.State = StateStarting
		return out, nil
	case "deactivating":
		out.State = StateStopping
		return out, nil
	}
	out.Confinement = s.confinementStatus(ctx, sd, name, unit, st.MainPID, detail)
	c, release, err := s.qmpSession(ctx, name)
	if err != nil {
		out.State, out.Reason = StateUnknown, err.Error()
		if time.Since(st.Since) < confirmTimeout {
			// QEMU has not opened its monitor yet.
			out.State, out.Reason = StateStarting, ""
		}
		return out, nil
	}
	defer release()
	qs, err := c.QueryStatus(ctx)
	if err != nil {
		out.State, out.Reason = StateUnknown, err.Error()
		return out, nil
	}
	out.QEMUStatus = string(qs.Status)
	if v != nil {
		s.fileStatus(&out, v.Applied)
	}
	out.State, out.Reason = qemuState(qs)
	if qs.Running && detail {
		if a, err := s.guest().PingOn(ctx, name, c); err == nil {
			out.GuestAgent = &a
		}
	}
	return out, nil
}

// List reports every VM vmsup knows: those with a state directory and those
// with a vmsup unit (even if their directory is gone).
func (s *Supervisor) List(ctx context.Context) ([]Status, error) {
	names, err := s.state.Known()
	if err != nil {
		return nil, err
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return nil, err
	}
	us, err := sd.List(ctx, "vmsup-*.service")
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	for _, u := range us {
		n := strings.TrimSuffix(strings.TrimPrefix(u.Name, "vmsup-"), ".service")
		if spec.ValidName(n) == nil {
			set[n] = true
		}
	}
	all := make([]string, 0, len(set))
	for n := range set {
		all = append(all, n)
	}
	sort.Strings(all)
	out := make([]Status, 0, len(all))
	for _, n := range all {
		st, err := s.status(ctx, n, false)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if err == nil {
			if st.State == StateRunning {
				// The guest's addresses, when its agent answers (at once
				// if the guest has not opened the channel).
				if a, err := s.GuestPing(ctx, n); err == nil && a.Responding {
					st.GuestAgent = &a
				}
			}
			out = append(out, st)
		}
	}
	return out, nil
}

// Names lists the VMs vmsup has a state directory for, without asking
// systemd (shell completion).
func (s *Supervisor) Names() ([]string, error) { return s.state.Known() }

// recorded fills in what the VM's view (nil without a record) and its UEFI
// variable store say.
func (s *Supervisor) recorded(out *Status, p vmstate.Paths, v *vmstate.View) {
	out.SecureBoot = secureBootStatus(p.UEFIVars)
	if v == nil {
		return
	}
	app := v.Applied
	out.Accel, out.AccelReason, out.SpecFile = app.Accel, app.AccelReason, v.Owner
	out.CPUModel, out.CPUMasks, out.UUID = app.CPUModel, app.CPUMasks, app.UUID
	out.VsockCID = app.VsockCID
	out.CPUs, out.Memory, out.Description = v.Booted.CPUs, v.Booted.Memory.String(), v.Booted.Description
	for _, d := range v.Disks {
		if d.Attached {
			out.AttachedDisks = append(out.AttachedDisks, d.Name)
		}
		if d.MovedFrom != "" {
			out.MovedDisks = append(out.MovedDisks, fmt.Sprintf("%s: %s -> %s", d.Name, d.MovedFrom, diskSource(d.Disk)))
		}
	}
	for _, h := range v.Booted.HostDevs {
		out.HostDevs = append(out.HostDevs, HostDevInfo{Address: h.Address, Name: h.Name})
	}
	for _, a := range app.AttachedHostDevs { // after the file's
		out.HostDevs = append(out.HostDevs, HostDevInfo{Address: a.Dev.Address, Name: a.Dev.Name, Attached: true})
	}
	for _, sn := range v.Tree.Snapshots {
		out.Snapshots = append(out.Snapshots, sn.Tag)
	}
	out.CurrentSnapshot = v.Tree.Current
}

// SecureBootStatus is a UEFI VM's variable store as Status shows it.
type SecureBootStatus struct {
	ovmfvars.Store
	Warning string `json:"warning,omitempty"`
	Err     string `json:"error,omitempty"` // the store could not be read
}

// secureBootStatus reads the VM's variable store; nil without one (not a
// UEFI VM, or never started).
func secureBootStatus(vars string) *SecureBootStatus {
	if _, err := os.Stat(vars); err != nil {
		return nil
	}
	st, err := ovmfvars.Read(vars)
	if err != nil {
		return &SecureBootStatus{Err: err.Error()}
	}
	return &SecureBootStatus{Store: st, Warning: st.Warning()}
}

// HostDevInfo is one host PCI device of a VM; Attached: hot-plugged.
type HostDevInfo struct {
	Address  string `json:"address"`
	Name     string `json:"name"`
	Attached bool   `json:"attached,omitempty"`
}
