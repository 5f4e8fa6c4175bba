package diskops

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// Host is what the disk operations need of the supervisor that runs the
// VMs: only the methods they call.
type Host interface {
	// State is the state root: paths, records.
	State() vmstore.Store
	// View is the VM as it runs (vmstore.View). A VM without a record is
	// an error wrapping vmstore.ErrNotFound; one no QEMU runs comes back
	// with an error wrapping vmstore.ErrNotRunning.
	View(name string) (*vmstore.View, error)
	// NotFound is the error for a VM name vmsup does not know.
	NotFound(name string) error
	// QMPSession connects to the VM's command monitor, one client at a
	// time; release lets it go. A VM no QEMU runs is an error wrapping
	// vmstore.ErrNotRunning (or ErrNotFound).
	QMPSession(ctx context.Context, name string) (c *qmp.Conn, release func(), err error)
	// AgentSession connects to the VM's guest agent, one client at a time.
	AgentSession(ctx context.Context, name string) (a *qmp.Agent, done func(), err error)
	// ConfinePaths grants the running VM's QEMU more files; ReleasePaths
	// takes them back.
	ConfinePaths(ctx context.Context, name string, rules ...units.PathRule) error
	ReleasePaths(ctx context.Context, name string, paths ...string) error
	// OpenDisk opens a file disk's image and chain beneath the place it
	// lies in and checks them (hostpaths.Places.OpenDisk): a snapshot's
	// overlay reaches QEMU as a descriptor (internal/lifecycle/diskfds).
	OpenDisk(ctx context.Context, d spec.Disk) (*storage.OpenedDisk, error)
	// ImageDirs are the image directories; InImageDirs says whether path
	// lies in one (the only places a running VM can open new files).
	ImageDirs() []string
	InImageDirs(path string) (bool, error)
	// CheckDiskPaths checks a disk's paths against the host's places;
	// Reachable checks that a running VM can open new files at paths.
	CheckDiskPaths(ctx context.Context, d spec.Disk) error
	Reachable(paths ...string) error
	// Tools are the storage tools (qemu-img, rbd).
	Tools() storage.Tools
	// Lifecycle records a vmsup event of the VM.
	Lifecycle(name, event string, data any)
	Logger() *slog.Logger

	// For a revert: the VM's unit as systemd has it; stopping the VM
	// under the lock its command holds; the file it last started with;
	// starting it again from it (resuming the guest from memory, "" to
	// boot), each step journaled in op.
	UnitStatus(ctx context.Context, name string) (units.Status, error)
	Stop(ctx context.Context, name string) error
	AppliedFile(name string) (*spec.File, error)
	StartRestored(ctx context.Context, f *spec.File, op *operation.Op, memory string) error
	// PinnedMachine is the machine type a start of f runs now: the VM's
	// pinned one (identity.PinMachine), which a memory state must match.
	PinnedMachine(f *spec.File) (string, error)
	// For a revert's recovery: the run state of the QEMU listening at sock
	// ("" when it does not answer), and the kill of the VM's unit (as
	// vmsup's, so its stop hook knows), its failed state cleared.
	RunState(ctx context.Context, sock string) qmp.RunState
	KillUnit(ctx context.Context, name string) error

	// For a clone: its start from f resuming the guest from memory
	// (under its own lock, each step seen by after; the lifecycle event
	// names from, "VM:TAG"), whether it runs, and taking it back.
	StartClone(ctx context.Context, f *spec.File, memory, from string, after func(vm, step string)) (Started, error)
	Running(ctx context.Context, name string) bool
	Kill(ctx context.Context, name string) error
	Remove(ctx context.Context, name string) error
}

// Started is what the start pipeline says of a clone it started (the
// supervisor's UpResult has it).
type Started struct {
	Accel       spec.Accel
	AccelReason string
	Note        string
}

// Service runs the disk operations of the VMs of one state root, as
// operations of kernel k.
type Service struct {
	k *operation.Kernel
	h Host
}

// New returns the disk operations on h's VMs, run through k.
func New(k *operation.Kernel, h Host) *Service { return &Service{k: k, h: h} }

// Register registers the disk operations' recoverers with the kernel.
func (s *Service) Register() {
	for kind, r := range map[operation.Kind]operation.Recoverer{
		opSnapshot: s.recoverSnapshot, opSnapshotRevert: s.recoverRevert, opSnapshotRemove: s.recoverSnapshotRemove,
		opClone: s.recoverClone, opBackup: s.recoverBackup, opNBDExport: s.recoverNBDExport, opDiskMove: s.recoverDiskMove,
	} {
		s.k.Register(kind, r)
	}
}

// Timeouts of the disk operations' own work.
const (
	// agentTimeout bounds one answer of the guest agent (the supervisor's
	// bound for its sessions).
	agentTimeout = 700 * time.Millisecond
	// undoTimeout bounds taking an operation's parts back after its
	// context ended.
	undoTimeout = 20 * time.Second
)

func (s *Service) paths(name string) vmstore.Paths { return s.h.State().Paths(name) }

// lock takes the VM's lock for command by, having settled what a killed
// command left (operation.Kernel.Lock).
func (s *Service) lock(ctx context.Context, name, by string) (*operation.Lock, error) {
	lk, _, err := s.k.Lock(ctx, name, by)
	return lk, err
}

// liveQMP is the running VM's monitor, or nil (no error) when QEMU is gone.
func (s *Service) liveQMP(ctx context.Context, name string) (*qmp.Conn, func(), error) {
	if _, err := os.Stat(s.paths(name).QMP); err != nil {
		return nil, func() {}, nil
	}
	return s.h.QMPSession(ctx, name)
}

// step is one named part of an operation (internal/lifecycle/steps).
type step = steps.Step

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func rulePaths(rules []units.PathRule) []string {
	paths := make([]string, len(rules))
	for i, r := range rules {
		paths[i] = r.Path
	}
	return paths
}
