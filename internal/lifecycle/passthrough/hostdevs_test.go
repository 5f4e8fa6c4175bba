package passthrough

import (
	"slices"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// TestSteps: a VM with host devices has the hostdevs step and a unit that
// may lock all its memory and 1 GiB (VFIO pins it); one without, neither.
func TestSteps(t *testing.T) {
	var m Manager
	var plan startplan.Plan
	f := &spec.File{VM: spec.VM{Name: "web", MaxMemory: 2 * spec.GiB}}
	if m.Steps(f, &plan) != nil {
		t.Error("no host devices: a step")
	}
	f.VM.HostDevs = []spec.HostDev{{Address: "0000:01:00.0"}}
	if got := steps.Names(m.Steps(f, &plan)); !slices.Equal(got, []string{Step}) {
		t.Errorf("steps %q", got)
	}
	var u units.Unit
	plan.ApplyUnit(&u)
	if u.MemLock != uint64(3*spec.GiB) {
		t.Errorf("MemLock %d", u.MemLock)
	}
}
