package nics

import (
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestStartSteps: the check first, one namespace for all cni NICs, one
// step per tap NIC (none for user networking); the unit gets the tun
// device and the stop-post hook ending in the VM's name.
func TestStartSteps(t *testing.T) {
	no := false
	s := Start{Manager: &Manager{Options: Options{VhostNet: &no}, Store: vmstore.Store{Root: t.TempDir()}},
		StopPost: []string{"/usr/bin/vmsup", "stop-post", "--root", "/r"}}
	f := &spec.File{VM: spec.VM{Name: "web", NICs: []spec.NIC{
		{Name: "a", Type: spec.NICCNI}, {Name: "b", Type: spec.NICCNI}, {Name: "lan", Type: spec.NICBridge}, {Name: "u", Type: spec.NICUser},
	}}}
	var plan startplan.Plan
	got := steps.Names(s.Steps(f, &plan))
	if want := []string{StepCheck, StepNetns, `nic "a"`, `nic "b"`, `nic "lan"`}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
	for range 2 { // the hook's command is the Start's, not shared with a unit
		var u units.Unit
		plan.ApplyUnit(&u)
		if want := []string{"/usr/bin/vmsup", "stop-post", "--root", "/r", "web"}; len(u.ExecStopPost) != 1 || !slices.Equal(u.ExecStopPost[0], want) {
			t.Errorf("ExecStopPost %q, want %q", u.ExecStopPost, want)
		}
		if !u.StopHooksPrivileged || !slices.Equal(u.DeviceAllow, []units.DeviceRule{{Path: "/dev/net/tun", Access: "rw"}}) {
			t.Errorf("unit %+v", u)
		}
	}
	if len(s.StopPost) != 4 {
		t.Errorf("StopPost changed: %q", s.StopPost)
	}
}
