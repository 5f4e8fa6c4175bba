package supervisor

import (
	"context"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/units"
)

// Companion units serve one QEMU of a VM from outside it: the console
// logger, swtpm, virtiofsd. Each starts just before its QEMU's unit and
// ends with it (or is stopped when the VM is torn down).

// companionUnit is the unit of kind that serves the VM unit vmUnit:
// "vmsup-KIND@NAME" ("@" keeps it out of the VM list; no VM unit has one)
// and, for the alternate unit of a local migration,
// "vmsup-KIND@NAME:migrated".
func companionUnit(kind, vmUnit string) string {
	base := strings.TrimSuffix(strings.TrimPrefix(vmUnit, "vmsup-"), ".service")
	return "vmsup-" + kind + "@" + strings.Replace(base, "@", ":", 1) + ".service"
}

// stopCompanion stops a companion unit, if it runs.
func stopCompanion(ctx context.Context, sd *units.Manager, unit string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	_ = sd.Stop(uctx, unit)
	_ = sd.ResetFailed(uctx, unit)
}

// stopCompanions stops what may still serve the VM once no QEMU of it
// runs: swtpm and virtiofsd end with their QEMU; this is for one whose
// QEMU never came (its start killed in between).
func (s *Supervisor) stopCompanions(ctx context.Context, name string) {
	// A companion's directory is made before its unit starts: a VM with
	// none (most) costs a down no D-Bus call.
	ents, _ := os.ReadDir(s.paths(name).Dir)
	if !slices.ContainsFunc(ents, func(e os.DirEntry) bool {
		return strings.HasPrefix(e.Name(), "tpm") || strings.HasPrefix(e.Name(), "virtiofs-")
	}) {
		return
	}
	sd, err := s.systemd(ctx)
	if err != nil {
		return
	}
	main := vmstate.UnitName(name)
	left, err := sd.List(ctx, companionUnit("tpm", main), companionUnit("tpm", vmstate.AltUnit(name, main)),
		"vmsup-fs-*@"+name+".service")
	if err != nil {
		return
	}
	for _, st := range left {
		stopCompanion(ctx, sd, st.Name)
	}
}

// companionUser is who a companion of the VM runs as, and its sandbox:
// QEMU's confined user (the sandbox's paths are the companion's to set),
// else the owner of the state directory, unsandboxed.
func (r *startRun) companionUser() (sb *units.Sandbox, uid, gid int, err error) {
	if c, err := r.s.confiner().Read(r.name); err == nil && c.User != "" && c.UID != 0 {
		return &units.Sandbox{User: c.User, Group: c.User}, int(c.UID), int(c.GID), nil
	}
	fi, err := os.Stat(r.p.Dir)
	if err != nil {
		return nil, 0, 0, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return nil, int(st.Uid), int(st.Gid), nil
}
