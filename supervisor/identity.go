package supervisor

import (
	"encoding/json"

	"github.com/vmsup/vmsup/internal/identity"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
)

// resolveIdentity picks the UUID and generation id this start's QEMU gets:
// a destination takes the source's (the guest must not see its machine
// change under it); a fresh start the file's uuid, else the last start's,
// else new ones, recorded with the rest of the start.
func (r *startRun) resolveIdentity() {
	var ids identity.IDs
	if r.mode != StartFresh {
		ids = identity.Incoming(&r.f.VM, r.in.ids)
	} else {
		var prev vmstate.Applied
		_ = json.Unmarshal(r.prev.app, &prev) // none yet: new ones
		ids = identity.Resolve(&r.f.VM, identity.IDs{UUID: prev.UUID, GenID: prev.GenID})
	}
	r.app.UUID, r.app.GenID = ids.UUID, ids.GenID
}

// recordedIDs are the IDs the VM would start with now, for an argv shown
// or checked before a start (new ones for a VM never started).
func (s *Supervisor) recordedIDs(vm *spec.VM) identity.IDs {
	var rec identity.IDs
	if app, err := s.state.ReadApplied(vm.Name); err == nil {
		rec = identity.IDs{UUID: app.UUID, GenID: app.GenID}
	}
	return identity.Resolve(vm, rec)
}
