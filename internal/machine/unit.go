package machine

import (
	"context"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/vsock"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// stopMargin is added to the spec's stop timeout for systemd's own bound, so
// the graceful hook (powerdown, wait, quit) always finishes before systemd
// escalates to signals.
const stopMargin = 15 * time.Second

// unitFor turns a VM into its transient unit: QEMU as the main process, the
// graceful stop hook as ExecStop=, cgroup limits from the spec.
func (s *Env) unitFor(f *spec.File, argv []string, accel spec.Accel) units.Unit {
	vm := &f.VM
	stop := []string{s.opts.Self, "stop-hook", "--root", s.opts.Root, vm.Name}
	u := units.Unit{
		Name:        vmstore.UnitName(vm.Name),
		Description: vmstore.UnitDescription(vm.Name),
		Slice:       s.opts.Slice,
		Argv:        argv,
		ExecStop:    [][]string{stop},
		// vmsup's own hooks talk QMP like vmsup itself and take back what
		// the host steps made (taps, grants, profiles): the sandbox is for
		// QEMU, and setting it up again for the hook would slow every stop.
		StopHooksPrivileged: true,
		TimeoutStop:         vm.StopTimeout.D() + stopMargin,
		MemoryMax:           uint64(vm.MaxMemory + vm.Limits.MemoryOverhead),
		CPUAccounting:       true,
		CPUQuota:            vm.Limits.CPUQuota,
		CPUWeight:           vm.Limits.CPUWeight,
		CPUAffinity:         vm.Pinning.EmulatorCPUs(),
		TasksMax:            vm.Limits.TasksMax,
		UMask:               0o077, // QEMU's sockets and files: owner only
		// A relative path QEMU is given (over QMP) resolves in the VM's
		// own directory, not from "/". Optional: the stop hooks must run
		// even if it is gone, and a QEMU left in "/" is what the raw QMP
		// policy reads from /proc and checks against.
		WorkingDir:         s.Paths(vm.Name).Dir,
		WorkingDirOptional: true,
	}
	if accel == spec.AccelKVM {
		u.DeviceAllow = append(u.DeviceAllow, units.DeviceRule{Path: "/dev/kvm", Access: "rw"})
	}
	if vm.Vsock.On() {
		u.DeviceAllow = append(u.DeviceAllow, units.DeviceRule{Path: vsock.Device, Access: "rw"})
	}
	u.After = shutdownAfter(vm)
	return u
}

// shutdownAfter is what a VM's unit is ordered after, so that at host
// shutdown the guest powers off (and stop-post removes its taps and ports)
// before the network and Open vSwitch go down.
func shutdownAfter(vm *spec.VM) []string {
	var after []string
	if len(vm.NICs) > 0 || vm.HasNetworkDisk() {
		after = append(after, "network.target")
	}
	for _, n := range vm.NICs {
		if n.Type == spec.NICOVS {
			return append(after, "openvswitch-switch.service")
		}
	}
	return after
}

// RunStateAt asks the QEMU listening at sock for its run state ("" when it
// does not answer).
func (s *Env) RunStateAt(ctx context.Context, sock string) qmp.RunState {
	dctx, cancel := context.WithTimeout(ctx, qmpConnectTimeout)
	defer cancel()
	c, err := qmp.Dial(dctx, sock, qmp.WithoutSymlink(), qmp.WithLogger(s.opts.Logger))
	if err != nil {
		return ""
	}
	defer c.Close()
	qs, err := c.QueryStatus(dctx)
	if err != nil {
		return ""
	}
	return qs.Status
}

// RemoveUnit kills a unit (a destination QEMU nobody will use) and clears
// its failed state. Its console's socket is left listening, a unit with no
// process, for what QEMU wrote last: the next start or down of the VM
// stops it (companion.StopLeft).
func (s *Env) RemoveUnit(ctx context.Context, sd *units.Manager, unit string) {
	uctx, cancel := context.WithTimeout(ctx, undoTimeout)
	defer cancel()
	sd.KillAndWait(uctx, unit)
}
