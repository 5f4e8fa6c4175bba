package machine

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/vmsup/vmsup/internal/lifecycle/identity"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// resolveIdentity picks the UUID and generation id this start's QEMU gets:
// a destination takes the source's (the guest must not see its machine
// change under it); a fresh start the file's uuid, else the last start's,
// else new ones, recorded with the rest of the start.
func (r *startRun) resolveIdentity() {
	var ids identity.IDs
	if r.mode != StartFresh {
		ids = identity.Incoming(&r.f.VM, r.in.IDs)
	} else {
		var prev vmstore.Applied
		_ = json.Unmarshal(r.prev.app, &prev) // none yet: new ones
		ids = identity.Resolve(&r.f.VM, identity.IDs{UUID: prev.UUID, GenID: prev.GenID})
	}
	r.app.UUID, r.app.GenID = ids.UUID, ids.GenID
}

// recordedIDs are the IDs the VM would start with now, for an argv shown
// or checked before a start (new ones for a VM never started).
func (s *Env) recordedIDs(vm *spec.VM) identity.IDs {
	var rec identity.IDs
	if app, err := s.state.ReadApplied(vm.Name); err == nil {
		rec = identity.IDs{UUID: app.UUID, GenID: app.GenID}
	}
	return identity.Resolve(vm, rec)
}

// resolveMachine picks the machine type this start's QEMU runs: the
// source's for a destination (the stream needs the same), else the one
// pinned at the VM's first start (identity.PinMachine).
func (r *startRun) resolveMachine() (err error) {
	if r.mode != StartFresh && r.in.Machine == "" {
		r.app.Machine = "" // an older source: its alias, as it ran it
		return nil
	}
	want, recorded := r.in.Machine, ""
	if r.mode == StartFresh {
		var prev vmstore.Applied
		_ = json.Unmarshal(r.prev.app, &prev)
		want, recorded = r.f.VM.Machine, prev.Machine
	}
	r.app.Machine, err = r.s.PinMachine(r.f, want, recorded)
	return err
}

// RecordedMachine is the machine type pinned for VM name ("" if none).
func (s *Env) RecordedMachine(name string) string {
	if app, err := s.state.ReadApplied(name); err == nil {
		return app.Machine
	}
	return ""
}

// PinMachine resolves want (f's machine, or a source's) against this QEMU
// (the host probe; a supervisor given Host facts only takes it as it is).
func (s *Env) PinMachine(f *spec.File, want, recorded string) (string, error) {
	resolve := func(m string) (string, error) { return m, nil }
	if s.opts.Host == nil || s.opts.HostCaps != nil {
		c, err := s.HostCaps(context.Background(), false)
		if err != nil {
			return "", fmt.Errorf("%s: %w", f.Path, err)
		}
		resolve = c.MachineType
	}
	m, err := identity.PinMachine(want, recorded, resolve)
	if err != nil {
		return "", f.Errorf("machine", "%v", err)
	}
	return m, nil
}
