package nics

import (
	"context"
	"fmt"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// The network's steps of a start (net-check, netns, `nic "NAME"`).
const (
	StepCheck = "net-check"
	StepNetns = "netns"
)

// StepNIC is the start step that makes the tap of NIC name.
func StepNIC(name string) string { return fmt.Sprintf("nic %q", name) }

// Start is the network's part of a VM's start.
type Start struct {
	*Manager
	// StopPost is the unit's stop-post hook without the VM's name (which
	// ends it): it removes the NICs' host side however QEMU ends.
	StopPost []string
	// Owner is the user the VM's QEMU runs as, who owns its taps.
	Owner func(ctx context.Context, vm string) (Owner, error)
}

var (
	_ startplan.Contributor = Start{}
	_ startplan.Reuser      = Start{}
)

// Steps prepares the VM's NICs: a check of everything they refer to
// (nothing is made before it passes), the namespace for cni NICs, then one
// step per tap NIC. The unit gets /dev/net/tun, the namespace and the
// stop-post hook that tears it all down however QEMU ends.
func (s Start) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	vm := &f.VM
	st := s.NewRecord(vm.Name)
	st.SecurityGroups = vm.SecurityGroups
	plan.AddUnit(func(u *units.Unit) {
		s.unit(u, vm.Name)
		if st.Netns != nil {
			u.NetworkNamespacePath = st.Netns.Unit
		}
	})
	teardown := func(ctx context.Context) { s.Teardown(ctx, vm.Name, false) }
	list := []steps.Step{{Name: StepCheck, Do: func(ctx context.Context) error {
		// A run that crashed before its hook could clean up left its
		// taps, ports and namespace behind: remove them first.
		if s.HasRecord(vm.Name) {
			s.Logger.Info("removing the network left by a previous run", "vm", vm.Name)
			if err := s.Teardown(ctx, vm.Name, false); err != nil {
				return fmt.Errorf("network left by a previous run: %w", err)
			}
		}
		return s.Check(ctx, f)
	}}}
	for _, nic := range vm.NICs {
		if nic.Type == spec.NICCNI {
			list = append(list, steps.Step{Name: StepNetns, Do: func(ctx context.Context) error {
				return s.MakeNetns(ctx, vm.Name, st)
			}, Undo: teardown})
			break
		}
	}
	for _, nic := range vm.NICs {
		if !nic.UsesTap() {
			continue
		}
		list = append(list, steps.Step{Name: StepNIC(nic.Name), Do: func(ctx context.Context) error {
			owner, err := s.Owner(ctx, vm.Name)
			if err != nil {
				return fmt.Errorf("nic %q: %w", nic.Name, err)
			}
			return s.NICUp(ctx, vm.Name, nic, "", owner, st)
		}, Undo: teardown})
	}
	return list
}

// Reuse: a local migration's new QEMU uses the running one's namespace,
// as its record has it, and the stop-post hook; its taps are its own
// (MoveSteps).
func (s Start) Reuse(f *spec.File, plan *startplan.Plan) error {
	plan.AddUnit(func(u *units.Unit) {
		if st, err := ReadRecord(plan.Paths); err == nil && st.Netns != nil {
			u.NetworkNamespacePath = st.Netns.Unit
		}
		s.unit(u, f.VM.Name)
	})
	return nil
}

// unit gives the VM's unit what its NICs need: the tun device (and
// vhost-net), and the stop-post hook that removes their host side.
func (s Start) unit(u *units.Unit, vm string) {
	u.DeviceAllow = append(u.DeviceAllow, s.UnitDevices()...)
	u.ExecStopPost = append(u.ExecStopPost, append(s.StopPost[:len(s.StopPost):len(s.StopPost)], vm))
	// The hook removes taps and takes back file grants: it needs root
	// even though QEMU runs unprivileged.
	u.StopHooksPrivileged = true
}
