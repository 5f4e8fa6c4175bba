package supervisor

import (
	"context"
	"io"
	"time"

	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The lifecycle's API (internal/machine), as the public front gives it.

type (
	AgentStatus      = machine.AgentStatus
	AttachedDisk     = machine.AttachedDisk
	AutostartResult  = machine.AutostartResult
	BusyError        = machine.BusyError
	Confinement      = machine.Confinement
	CopyOptions      = machine.CopyOptions
	DownOptions      = machine.DownOptions
	DownResult       = machine.DownResult
	EnableResult     = machine.EnableResult
	ExecResult       = machine.ExecResult
	GateWaiting      = machine.GateWaiting
	GuestAddress     = machine.GuestAddress
	Host             = machine.Host
	HostCaps         = machine.HostCaps
	HostFact         = machine.HostFact
	HostProbeOptions = machine.HostProbeOptions
	NICStatus        = machine.NICStatus
	NetworkOptions   = machine.NetworkOptions
	Options          = machine.Options
	OwnerError       = machine.OwnerError
	RebootMode       = machine.RebootMode
	RebootResult     = machine.RebootResult
	RestartOptions   = machine.RestartOptions
	StartMode        = machine.StartMode
	StepError        = machine.StepError
	StopStep         = machine.StopStep
	UpAction         = machine.UpAction
	UpOptions        = machine.UpOptions
	UpResult         = machine.UpResult
)

const (
	BootUnitName         = machine.BootUnitName
	Changed              = machine.Changed
	DefaultCopyMax       = machine.DefaultCopyMax
	DefaultCopyTimeout   = machine.DefaultCopyTimeout
	DefaultExecTimeout   = machine.DefaultExecTimeout
	DefaultQEMUUser      = machine.DefaultQEMUUser
	DefaultUnplugTimeout = machine.DefaultUnplugTimeout
	EventPanicked        = machine.EventPanicked
	EventRestartLimit    = machine.EventRestartLimit
	EventRestarting      = machine.EventRestarting
	HookConsoleLog       = machine.HookConsoleLog
	HookPost             = machine.HookPost
	HookRebootApply      = machine.HookRebootApply
	HookSettle           = machine.HookSettle
	HookStop             = machine.HookStop
	PerVMUser            = machine.PerVMUser
	RebootACPI           = machine.RebootACPI
	RebootAgent          = machine.RebootAgent
	RebootAuto           = machine.RebootAuto
	Restarted            = machine.Restarted
	SharedQEMUUser       = machine.SharedQEMUUser
	StartFresh           = machine.StartFresh
	StartIncoming        = machine.StartIncoming
	StartIncomingLocal   = machine.StartIncomingLocal
	Started              = machine.Started
	StepArgv             = machine.StepArgv
	StepCheck            = machine.StepCheck
	StepConfine          = machine.StepConfine
	StepConfirm          = machine.StepConfirm
	StepConsole          = machine.StepConsole
	StepCopies           = machine.StepCopies
	StepDisks            = machine.StepDisks
	StepIncoming         = machine.StepIncoming
	StepLive             = machine.StepLive
	StepLock             = machine.StepLock
	StepNetCheck         = machine.StepNetCheck
	StepNetns            = machine.StepNetns
	StepRecord           = machine.StepRecord
	StepRestore          = machine.StepRestore
	StepReuse            = machine.StepReuse
	StepStateDir         = machine.StepStateDir
	StepStorage          = machine.StepStorage
	StepTPM              = machine.StepTPM
	StepUnit             = machine.StepUnit
	StepValidate         = machine.StepValidate
	StepVirtioFS         = machine.StepVirtioFS
	StoppedACPI          = machine.StoppedACPI
	StoppedAgent         = machine.StoppedAgent
	StoppedAlready       = machine.StoppedAlready
	StoppedKill          = machine.StoppedKill
	StoppedNotCurrent    = machine.StoppedNotCurrent
	StoppedQuit          = machine.StoppedQuit
	Unchanged            = machine.Unchanged
)

var (
	ErrImageOwned    = machine.ErrImageOwned
	ErrInterrupted   = machine.ErrInterrupted
	ErrNoSelf        = machine.ErrNoSelf
	ErrNotFound      = machine.ErrNotFound
	ErrNotRunning    = machine.ErrNotRunning
	ErrOutsidePlaces = machine.ErrOutsidePlaces
	ErrPaused        = machine.ErrPaused
	ErrPreserved     = machine.ErrPreserved
)

// ProbeHost reads the host facts from /proc, /sys and /dev, without asking
// QEMU (Supervisor.HostCaps does).
func ProbeHost() Host { return machine.ProbeHost() }

// RunConsoleLog is the console logger's work (HookConsoleLog's arguments
// after the command): copy the FIFO into the log until its QEMU closes it.
func RunConsoleLog(ctx context.Context, args []string) error { return machine.RunConsoleLog(ctx, args) }

// New returns a Supervisor. It does not connect to systemd until a command
// needs it, so pure commands (argv, validate) work without one.

// Validate checks files as Up would, without starting anything: each parses,
// names are unique across files, what they refer to lies in this host's
// places (CheckPaths) and exists on this host.
// It is ValidateContext without a deadline of the caller's.
func (s *Supervisor) Validate(files ...*spec.File) error { return s.env.Validate(files...) }

// ValidateContext is Validate bounded by ctx (each check has its own bound
// too: storage probes, NIC targets, the confinement's image rule). Every
// check runs and the error names every problem, one line each in file
// order (a *spec.Errors per file, files joined), except the checks that
// build on the others: the argv and the confinement check need everything
// else sound (they would say again, in their words, what another check
// said). A file from spec.ParsePartial brings its own errors; the host
// checks skip the fields they concern.
func (s *Supervisor) ValidateContext(ctx context.Context, files ...*spec.File) error {
	return s.env.ValidateContext(ctx, files...)
}

// Argv returns the QEMU command line of the machine vmsup would start for
// f, every disk named by path: what a raw QEMU run of the same machine
// takes. vmsup itself starts QEMU paused without the disks
// DisksByDescriptor lists and plugs those as descriptors (internal/lifecycle/diskfds).
func (s *Supervisor) Argv(f *spec.File) ([]string, error) { return s.env.Argv(f) }

// DisksByDescriptor names the disks of f that a start gives QEMU as
// descriptors over QMP rather than on its command line.
func (s *Supervisor) DisksByDescriptor(f *spec.File) []string { return s.env.DisksByDescriptor(f) }

// Up brings each VM up: validated all together first (an invalid file
// starts nothing), then started concurrently, each on its own. A VM already
// running with the same spec is left alone; one running with a different
// spec is reported as Changed and not touched. Results are in file order,
// for the VMs that came up; the error joins every VM's failure.
func (s *Supervisor) Up(ctx context.Context, files ...*spec.File) ([]UpResult, error) {
	return s.env.Up(ctx, files...)
}

// UpWith is Up with options.
func (s *Supervisor) UpWith(ctx context.Context, o UpOptions, files ...*spec.File) ([]UpResult, error) {
	return s.env.UpWith(ctx, o, files...)
}

// Reboot asks the guest to reboot while QEMU keeps running: through the
// guest agent (guest-shutdown reboot) when it answers, else by ACPI: QEMU is
// told to pause instead of exiting when the guest powers off, the power
// button pressed, and once the guest is down the machine is reset and
// resumed (libvirt's "fake reboot"). A reboot cut short by a killed vmsup
// is finished by the guardian, so a later guest poweroff is never left
// paused.
func (s *Supervisor) Reboot(ctx context.Context, name string, mode RebootMode) (RebootResult, error) {
	return s.env.Reboot(ctx, name, mode)
}

// Reset is a hard reset (QMP system_reset): the guest restarts at once,
// without shutting down; QEMU keeps running.
func (s *Supervisor) Reset(ctx context.Context, name string) error { return s.env.Reset(ctx, name) }

// Kill ends the VM's QEMU at once with SIGKILL: no shutdown, no flush of
// QEMU's caches. The unit is gone when it returns.
func (s *Supervisor) Kill(ctx context.Context, name string) (DownResult, error) {
	return s.env.Kill(ctx, name)
}

// Restart is RestartWith without options.
func (s *Supervisor) Restart(ctx context.Context, f *spec.File) (UpResult, error) {
	return s.env.Restart(ctx, f)
}

// RestartWith applies a changed file to a running VM the only way QEMU allows
// for most settings: a graceful down, then up with the new spec, gated by
// the VM's [health] (healthGate). A VM that is not running is simply
// brought up. If the new spec fails to start or to pass the gate, the spec
// that ran before is started again, so a bad edit never leaves the VM down;
// the error says so.
func (s *Supervisor) RestartWith(ctx context.Context, f *spec.File, o RestartOptions) (UpResult, error) {
	return s.env.RestartWith(ctx, f, o)
}

// AppliedSpec is the spec the VM was last started with (as vmsup recorded
// it, not the file as it is now).
func (s *Supervisor) AppliedSpec(name string) (*spec.File, error) { return s.env.AppliedSpec(name) }

// HostCaps returns the host probe's record: its own while current (the QEMU
// binary, kernel and /dev/kvm unchanged), else Options.HostCaps, else the
// cache under Root/cache, else by probing. refresh probes again.
func (s *Supervisor) HostCaps(ctx context.Context, refresh bool) (*HostCaps, error) {
	return s.env.HostCaps(ctx, refresh)
}

// Settle is the guardian's work ("vmsup settle NAME"): it waits for the
// VM's lock, then settles any operation left unfinished; a recovery that
// fails is logged and tried again (under the lock each time, which it
// lets go in between) with a growing wait, for up to 5 minutes. The note
// says what was done ("" when the command had ended cleanly).
func (s *Supervisor) Settle(ctx context.Context, name string) (string, error) {
	return s.env.Settle(ctx, name)
}

// Networks are the host's managed networks (vmsup network; internal/net/netmanage).
func (s *Supervisor) Networks() *netmanage.Manager { return s.env.Networks() }

// StopPost is the unit's ExecStopPost= hook ("vmsup stop-post NAME"): it
// removes the VM's taps, ports, CNI attachments and namespace, and its
// disks' secret copies, and gives its host PCI devices back, however QEMU ended (down, systemctl stop, crash). It runs inside the unit, so in the
// VM's namespace for cni VMs; it moves to the namespace of PID 1 (the
// host's, as systemd sees it) so CNI plugins find the host side there.
// It does not take the VM lock: Down holds it while it waits for the unit.
// Like StopHook it acts only for the VM's current unit: another one (a
// migration's other QEMU) shares the network with it.
func (s *Supervisor) StopPost(ctx context.Context, name, unit string) error {
	return s.env.StopPost(ctx, name, unit)
}

// Exec runs argv in the guest through its agent and waits for it up to
// timeout (DefaultExecTimeout if 0).
func (s *Supervisor) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (ExecResult, error) {
	return s.env.Exec(ctx, name, argv, timeout)
}

// CopyFromGuest copies the guest's file at path to w, at most o.Max bytes.
func (s *Supervisor) CopyFromGuest(ctx context.Context, name, path string, w io.Writer, o CopyOptions) (int64, error) {
	return s.env.CopyFromGuest(ctx, name, path, w, o)
}

// CopyToGuest writes r to the guest's file at path, at most o.Max bytes.
func (s *Supervisor) CopyToGuest(ctx context.Context, name string, r io.Reader, path string, o CopyOptions) (int64, error) {
	return s.env.CopyToGuest(ctx, name, r, path, o)
}

// GuestPing asks the VM's guest agent for its ping, version, OS and
// addresses, within a bound.
func (s *Supervisor) GuestPing(ctx context.Context, name string) (AgentStatus, error) {
	return s.env.GuestPing(ctx, name)
}

// Enable marks the VMs in files to start at every boot and installs the
// boot unit (checked as up checks them first; nothing is started).
func (s *Supervisor) Enable(ctx context.Context, files ...*spec.File) ([]EnableResult, error) {
	return s.env.Enable(ctx, files...)
}

// Disable removes the boot marks of the named VMs (it does not stop them).
func (s *Supervisor) Disable(ctx context.Context, names ...string) error {
	return s.env.Disable(ctx, names...)
}

// Enabled lists the VMs marked for autostart, with the file each starts from.
func (s *Supervisor) Enabled() (map[string]string, error) { return s.env.Enabled() }

// Autostart brings up every enabled VM once per boot, each on its own.
func (s *Supervisor) Autostart(ctx context.Context) ([]AutostartResult, error) {
	return s.env.Autostart(ctx)
}

// FileOf is the file VM name belongs to (its owner), for commands that
// take a VM's name where a file goes. ErrNotFound when vmsup does not know
// the VM.
func (s *Supervisor) FileOf(name string) (string, error) { return s.env.FileOf(name) }

// CheckPath reports whether a VM file's key (as errors name it:
// "disk[0].file", "boot.kernel", "nic[0].cni_config"; its last key decides
// the places) may name path on this host, symlinks and ".." resolved: nil,
// or one line saying where path leads and the places allowed. What vmsup
// import asks of each path it would write.
func (s *Supervisor) CheckPath(field, path string) error { return s.env.CheckPath(field, path) }

// CheckPaths checks every host path f names against this host's places
// (Options.ImageDirs, BlockDirs, ConfigDirs, AllowPaths), after symlinks
// and "..", and the bases an existing qcow2 image's header names (QEMU
// opens them too): one error per key outside them, at its place in f
// (f.Join). Keys with a problem in f itself are skipped. Validate (so up,
// apply and restart) checks it first; a fleet agent checks each spec it
// is given with it before anything else.
func (s *Supervisor) CheckPaths(ctx context.Context, f *spec.File) error {
	return s.env.CheckPaths(ctx, f)
}

// CheckDisk checks a disk given alone (vmsup import asks it of each disk
// it would write) as up would: its host paths against the places, and
// its image and backing chain opened beneath them as objects (one link,
// no external data file, no protocol base), connecting nowhere.
func (s *Supervisor) CheckDisk(ctx context.Context, d spec.Disk) error {
	return s.env.CheckDisk(ctx, d)
}

// StartSteps lists the steps a start of f runs in mode: what AfterStep sees,
// in order.
func (s *Supervisor) StartSteps(f *spec.File, mode StartMode) []string {
	return s.env.StartSteps(f, mode)
}

// Down shuts the VM down gracefully: ACPI powerdown over QMP, wait up to the
// spec's stop timeout for QEMU to exit, then QMP quit, then SIGKILL. The unit
// is gone when Down returns; the state directory and applied spec stay.
func (s *Supervisor) Down(ctx context.Context, name string) (DownResult, error) {
	return s.env.Down(ctx, name)
}

// DownWith is Down with options: another timeout, quit or kill at once.
func (s *Supervisor) DownWith(ctx context.Context, name string, o DownOptions) (DownResult, error) {
	return s.env.DownWith(ctx, name, o)
}

// StopHook is what the unit's ExecStop= runs (as "vmsup stop-hook --unit
// UNIT NAME"): on "systemctl stop" or host shutdown it gives the guest the
// same graceful powerdown as Down. systemd also runs it after QEMU exited by
// itself ($MAINPID unset); then it returns at once. It acts only if unit is
// the VM's current QEMU: the hook of another (an orphan migration
// destination) must never power off the live guest; systemd then stops
// that QEMU by signal. An empty unit (a unit started by an older vmsup)
// is taken as current.
func (s *Supervisor) StopHook(ctx context.Context, name, unit string) (StopStep, error) {
	return s.env.StopHook(ctx, name, unit)
}

// ConfinePaths extends a running VM's confinement by files it is about to
// use (a hot-plugged disk and its backing chain): the QEMU user gets access
// and the AppArmor profile, if loaded, is reloaded with them, before the
// device is added. The unit's mount namespace is fixed at start, so a
// hot-plugged file must lie under a path the unit already sees (an image
// directory, not /tmp or /home).
func (s *Supervisor) ConfinePaths(ctx context.Context, name string, rules ...units.PathRule) error {
	return s.env.ConfinePaths(ctx, name, rules...)
}

// ReleasePaths undoes ConfinePaths after a device was detached.
func (s *Supervisor) ReleasePaths(ctx context.Context, name string, paths ...string) error {
	return s.env.ReleasePaths(ctx, name, paths...)
}

// AppArmorProfile returns the AppArmor profile vmsup loads for f where the
// kernel has AppArmor (disks with their backing chains, boot files, the
// state directory), whatever this host has.
func (s *Supervisor) AppArmorProfile(ctx context.Context, f *spec.File) (*units.Profile, error) {
	return s.env.AppArmorProfile(ctx, f)
}

// Close releases the systemd connection.
func (s *Supervisor) Close() error { return s.env.Close() }

// Root returns the state root in use.
func (s *Supervisor) Root() string { return s.env.Root() }

// StopPostHook is the unit's ExecStopPost= work: the network and secret
// copies go; then, if the guest rebooted into a QEMU told to exit on
// reboot, its guardian starts it again.
func (s *Supervisor) StopPostHook(ctx context.Context, name, unit string) (string, error) {
	return s.env.StopPostHook(ctx, name, unit)
}
