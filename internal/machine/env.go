package machine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	hostcaps "github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Options configure a Supervisor. The zero value of each field has a
// documented default.
type Options struct {
	// Root holds every VM's state directory (Root/vms/NAME). Default
	// /var/lib/vmsup. It must be the same path for vmsup and for the
	// systemd that runs the units.
	Root string
	// SystemdBus is the D-Bus address of the systemd that runs VM units
	// ("unix:path=..."); "" means the host's system bus.
	SystemdBus string
	// QEMU is the QEMU binary. Default /usr/bin/qemu-system-x86_64.
	QEMU string
	// Self is the binary the units call back into: the graceful stop
	// (ExecStop=), the network clean-up (ExecStopPost=) and the guardian of
	// an interrupted command, with the arguments HandleHook takes. Default:
	// the running program if it is vmsup, else /usr/local/bin/vmsup or
	// /usr/bin/vmsup. A program that sets it to itself must call HandleHook
	// first in main.
	Self string
	// JournalDir, when set, is passed to journalctl -D to read a failed
	// QEMU's last words (for a systemd whose journal is not the host's).
	JournalDir string
	// Slice the VM units go in. Default "vmsup.slice".
	Slice string
	// WaitForLock makes state-changing commands wait for a busy VM's lock
	// (until their context ends) instead of failing with *BusyError.
	WaitForLock bool
	// Network says how NICs reach the host (tap owner, OVS, CNI, netns).
	Network NetworkOptions
	// QEMUUser is the unprivileged user QEMU runs as; created as a system
	// user if missing. Default PerVMUser ("per-vm"): each VM its own, so
	// that no VM's QEMU can open another's images. A user name (e.g.
	// SharedQEMUUser) runs them all as that one user.
	QEMUUser string
	// ImageDirs are vmsup's image directories: where a VM file's images,
	// boot files, seeds' files and shares may lie (with AllowPaths), where
	// hot-plugged and moved disks and snapshot overlays go (every unit sees
	// them), and the only places a VM with security.apparmor = "required"
	// may have disks. Default Root/images.
	ImageDirs []string
	// BlockDirs are where a disk's file may be a host block device: an
	// entry of one of them (/dev/disk/by-id/X) that is a block device.
	// Default /dev/disk/by-id, /dev/disk/by-path, /dev/mapper.
	BlockDirs []string
	// ConfigDirs are where disks' ceph_conf and secret_file and NICs'
	// cni_config may lie. Default /etc/ceph, /etc/cni/net.d, /etc/vmsup.
	ConfigDirs []string
	// AllowPaths are more places (directories or files) this host lets VM
	// files name, for every path key. Default /var/cache/vmsup (the test
	// guest scripts/build-guest.sh builds). A path outside all of these
	// (after symlinks and "..") is refused by Validate, Up, Apply, hot-plug
	// and disk moves, naming the key and the places (CheckPaths).
	AllowPaths []string
	// SystemdAnalyze is the systemd-analyze command (with leading arguments,
	// e.g. an nsenter prefix) status uses to measure a VM unit's exposure.
	// Default "systemd-analyze" talking to SystemdBus.
	SystemdAnalyze []string
	// UnitDir is where vmsup enable installs the persistent boot unit
	// (BootUnitName). Default /etc/systemd/system.
	UnitDir string
	// BootTarget is the target that pulls the boot unit in. Default
	// multi-user.target.
	BootTarget string
	// RunDir holds what must not outlive a boot (which VMs autostart has
	// already started). Default /run/vmsup.
	RunDir string
	// Host facts; nil means the host probe's (HostCaps). Given without
	// HostCaps, nothing is probed and -cpu host gets no masks.
	Host *Host
	// HostCaps, when set, is used instead of probing this host.
	HostCaps *HostCaps
	// HostCapsCache is where the host probe's record is kept. Default
	// Root/cache/hostcaps.json.
	HostCapsCache string
	// UnplugTimeout bounds how long an unplug (disk, NIC, DIMM) waits for
	// the guest to release the device (DEVICE_DELETED). Default
	// DefaultUnplugTimeout.
	UnplugTimeout time.Duration
	// SysRoot and DevRoot are where host PCI devices ([[hostdev]]) are
	// found, bound and opened: sysfs and devtmpfs. Default /sys and /dev.
	SysRoot, DevRoot string
	// Logger; nil discards.
	Logger *slog.Logger
	// AfterStep, when set, is called after each step of a multi-step
	// operation: a start (StartSteps lists them), a hot-plug (`nic "X":
	// tap` ... `nic "X": record`, `disk "D": prepare` ... `disk "D":
	// record`), a migration (migrate-prepared, migrate-completed). Used to
	// trace and to inject faults in tests.
	AfterStep func(vm, step string)
}

// Env is the environment every lifecycle step and feature works in: the
// state root, the operation kernel, systemd, the host facts and the QMP
// sessions of the VMs under one Root.
type Env struct {
	opts Options

	state vmstore.Store // the state root: paths, records, locks

	mu   sync.Mutex // guards sd and caps, filled on first use
	sd   *units.Manager
	caps *HostCaps

	settleRetry retryPolicy // a guardian's (Settle); tests shorten it

	ops *operation.Kernel // the VMs' operations: locks, journals, recovery
}

// New returns a Supervisor. It does not connect to systemd until a command
// needs it, so pure commands (argv, validate) work without one.
func New(opts Options) (*Env, error) {
	if opts.Root == "" {
		opts.Root = "/var/lib/vmsup"
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, err
	}
	opts.Root = root
	if opts.QEMU == "" {
		opts.QEMU = "/usr/bin/qemu-system-x86_64"
	}
	if opts.Self == "" {
		opts.Self = defaultSelf() // "" fails a start with ErrNoSelf
	}
	if opts.QEMUUser == "" {
		opts.QEMUUser = DefaultQEMUUser
	}
	if len(opts.ImageDirs) == 0 {
		opts.ImageDirs = []string{filepath.Join(opts.Root, "images")}
	}
	opts.BlockDirs = orDefaults(opts.BlockDirs, places.DefaultBlockDirs)
	opts.ConfigDirs = orDefaults(opts.ConfigDirs, places.DefaultConfigDirs)
	opts.AllowPaths = orDefaults(opts.AllowPaths, places.DefaultAllowPaths)
	if opts.Slice == "" {
		opts.Slice = "vmsup.slice"
	}
	opts.UnitDir = orDefault(opts.UnitDir, "/etc/systemd/system")
	opts.BootTarget = orDefault(opts.BootTarget, "multi-user.target")
	opts.RunDir = orDefault(opts.RunDir, "/run/vmsup")
	opts.SysRoot = orDefault(opts.SysRoot, "/sys")
	opts.DevRoot = orDefault(opts.DevRoot, "/dev")
	opts.HostCapsCache = orDefault(opts.HostCapsCache, filepath.Join(opts.Root, "cache", "hostcaps.json"))
	if opts.UnplugTimeout <= 0 {
		opts.UnplugTimeout = DefaultUnplugTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Env{opts: opts, state: vmstore.Store{Root: opts.Root}, settleRetry: defaultSettleRetry()}
	s.ops = operation.New(operation.Options{Store: s.state, Wait: opts.WaitForLock, After: opts.AfterStep, Logger: opts.Logger,
		GiveUp: s.stopUnknown})
	s.registerRecoverers()
	return s, nil
}

// Close releases the systemd connection.
func (s *Env) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sd != nil {
		s.sd.Close()
		s.sd = nil
	}
	return nil
}

// Root returns the state root in use.
func (s *Env) Root() string { return s.opts.Root }

func (s *Env) Systemd(ctx context.Context) (*units.Manager, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sd != nil {
		return s.sd, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := units.Connect(cctx, s.opts.SystemdBus)
	if err != nil {
		return nil, err
	}
	s.sd = m
	return m, nil
}

// DefaultUnplugTimeout is how long an unplug (a disk, a NIC, a DIMM) waits
// for the guest to release the device (DEVICE_DELETED) before it gives up
// and leaves the device attached (Options.UnplugTimeout).
const DefaultUnplugTimeout = 20 * time.Second

// Timeouts for the parts of vmsup's own work.
const (
	qmpConnectTimeout = 3 * time.Second
	qmpLockTimeout    = 10 * time.Second
	undoTimeout       = 20 * time.Second
	quitTimeout       = 5 * time.Second
	killTimeout       = 10 * time.Second
)

// ConfirmTimeout bounds the wait for a new QEMU under accel to answer QMP
// and run: sized to the host, longer under TCG and under load
// (hostcaps.ConfirmTimeout; a fixed 10 s failed the first up on a slow
// host).
func ConfirmTimeout(accel spec.Accel) time.Duration {
	return hostcaps.ConfirmTimeout(accel, hostcaps.LoadFactor())
}

// ErrNotRunning means the VM is known but has no running QEMU to talk to.
// A name vmsup does not know at all is ErrNotFound instead.
var ErrNotRunning = vmstore.ErrNotRunning

// Absent is the error for a VM whose QEMU can't be reached because it
// does not run: ErrNotFound when vmsup knows no VM of that name (no state
// directory), else ErrNotRunning. One wording for each, whatever socket was
// missing.
func (s *Env) Absent(name string) error {
	if _, err := os.Stat(s.Paths(name).Dir); errors.Is(err, os.ErrNotExist) {
		return s.NotFound(name)
	}
	return vmerr.Wrap(name, ErrNotRunning)
}

// QMPSession connects to the VM's command monitor. QEMU serves one client
// per monitor socket at a time, so vmsup processes take turns through a file
// lock beside the socket instead of queueing unseen in QEMU's listen backlog;
// the event monitor (events.sock) is left for long-lived watchers.
func (s *Env) QMPSession(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	p := s.Paths(name)
	lctx, cancel := context.WithTimeout(ctx, qmpLockTimeout)
	defer cancel()
	fl, ok, err := vmstore.LockFile(lctx, p.QMPLock, true)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, s.Absent(name)
	}
	if err != nil {
		return nil, nil, vmerr.Wrap(name, fmt.Errorf("QMP lock: %w", err))
	}
	if !ok {
		return nil, nil, vmerr.Wrap(name, fmt.Errorf("QMP monitor busy for %s (another vmsup command is using it)", qmpLockTimeout))
	}
	dctx, dcancel := context.WithTimeout(ctx, qmpConnectTimeout)
	defer dcancel()
	// WithoutSymlink: the QEMU user owns the directory; it must not be able
	// to point root vmsup at another VM's monitor.
	c, err := qmp.Dial(dctx, p.QMP, qmp.WithLogger(s.opts.Logger), qmp.WithoutSymlink())
	if err != nil {
		fl.Unlock()
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, nil, s.Absent(name) // QEMU gone, its lock file left
		}
		return nil, nil, vmerr.Wrap(name, fmt.Errorf("QMP: %w", err))
	}
	return c, func() { c.Close(); fl.Unlock() }, nil
}

// State is the state root: paths, records, locks.
func (s *Env) State() vmstore.Store { return s.state }

// Ops is the operation kernel: the VMs' locks, journals and recoverers.
func (s *Env) Ops() *operation.Kernel { return s.ops }

// Opts are the options the Env was made with, defaults filled in (read
// only).
func (s *Env) Opts() *Options { return &s.opts }
