package diskops

import (
	"context"
	"os"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// Started is what the start pipeline says of a clone it started (the
// supervisor's UpResult has it).
type Started = machine.StartReport

// Service runs the disk operations of the VMs of one state root, as
// operations of its environment's kernel.
type Service struct {
	k   *operation.Kernel
	env *machine.Env
}

// New returns the disk operations on env's VMs, run through its operation
// kernel (env.Ops()).
func New(env *machine.Env) *Service { return &Service{k: env.Ops(), env: env} }

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

func (s *Service) paths(name string) vmstore.Paths { return s.env.State().Paths(name) }

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
	return s.env.QMPSession(ctx, name)
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
