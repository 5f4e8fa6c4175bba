package identity

import (
	"cmp"
	"context"
	"fmt"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/spec"
)

// StepCredentials is the start step that writes the credentials' files.
const StepCredentials = "credentials"

// Incoming returns the IDs a migration destination's QEMU gets: the
// source's (the guest must not see its machine change under it), the
// file's uuid first; a new generation id if the source, older than
// vmgenid, had none.
func Incoming(vm *spec.VM, source IDs) IDs {
	ids := IDs{UUID: cmp.Or(vm.UUID, source.UUID), GenID: source.GenID}
	if ids.GenID == "" && vm.VMGenID {
		ids.GenID = Resolve(vm, IDs{}).GenID
	}
	return ids
}

// Credentials is the credentials' part of a VM's start.
type Credentials struct{}

var _ startplan.Contributor = Credentials{}

// Steps writes the files the VM's credentials reach QEMU through (the
// stop-post hook removes them with the disk secrets).
func (Credentials) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	if len(f.VM.Credentials) == 0 {
		return nil
	}
	return []steps.Step{{
		Name: StepCredentials,
		Do: func(context.Context) error {
			if err := WriteCredentials(plan.Paths.Dir, &f.VM); err != nil {
				return fmt.Errorf("credentials: %w", err)
			}
			return nil
		},
		Undo: func(context.Context) { RemoveCredentials(plan.Paths.Dir) },
	}}
}
