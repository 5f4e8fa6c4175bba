package supervisor

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/internal/vtpm"
	"github.com/vmsup/vmsup/units"
)

// A VM's TPM: swtpm in a companion unit ("vmsup-tpm@NAME"), started just
// before each QEMU of the VM and ending with it (internal/vtpm).

// StepTPM is the start step that starts the VM's swtpm.
const StepTPM = "tpm"

// companionUnit is the unit of kind that serves the VM unit vmUnit:
// "vmsup-KIND@NAME" ("@" keeps it out of the VM list; no VM unit has one)
// and, for the alternate unit of a local migration,
// "vmsup-KIND@NAME:migrated".
func companionUnit(kind, vmUnit string) string {
	base := strings.TrimSuffix(strings.TrimPrefix(vmUnit, "vmsup-"), ".service")
	return "vmsup-" + kind + "@" + strings.Replace(base, "@", ":", 1) + ".service"
}

// tpmPaths are the TPM files of the QEMU of vmUnit: each unit its own, so
// the two QEMUs of a local migration each have a swtpm.
func tpmPaths(p vmstate.Paths, vmUnit string) vtpm.Paths {
	_, alt, _ := strings.Cut(strings.TrimSuffix(vmUnit, ".service"), "@")
	return vtpm.PathsFor(p.Dir, alt)
}

// tpmReady bounds how long swtpm takes to listen (measured: ~20 ms).
const tpmReady = 10 * time.Second

// startTPM prepares the TPM's state (manufactured at the VM's first start;
// a destination's comes in the migration stream) and starts swtpm as
// QEMU's user, in a sandbox that sees only its own directory.
func (r *startRun) startTPM(ctx context.Context) error {
	b, err := vtpm.Find()
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	tp := tpmPaths(r.p, r.unit)
	uid, gid, err := vtpm.Owner(r.p.Dir)
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	var sb *units.Sandbox
	if c, err := r.s.confiner().Read(r.name); err == nil && c.User != "" && c.UID != 0 {
		sb, uid, gid = &units.Sandbox{User: c.User, Group: c.User}, int(c.UID), int(c.GID)
	}
	if r.mode == StartIncomingLocal {
		// Left by an earlier migration; the live state comes in the stream
		// (this directory is never the running QEMU's: tpmPaths).
		if err := os.RemoveAll(tp.Dir); err != nil {
			return fmt.Errorf("tpm: %w", err)
		}
	}
	if err := vtpm.Prepare(ctx, b, tp, r.mode == StartFresh, uid, gid); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	unit := companionUnit("tpm", r.unit)
	stopCompanion(ctx, r.sd, unit) // a swtpm left by a start killed before its QEMU connected
	if err := r.sd.Start(ctx, vtpm.Unit(unit, r.name, r.unit, b, tp, sb)); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	deadline := time.Now().Add(tpmReady)
	for {
		if _, err := os.Stat(tp.Socket); err == nil {
			return nil
		}
		if st, err := r.sd.Status(ctx, unit); err == nil && st.Gone() || time.Now().After(deadline) {
			return fmt.Errorf("tpm: swtpm did not listen on %s: %s", tp.Socket, r.s.lastWords(ctx, unit))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (r *startRun) stopTPM(ctx context.Context) {
	stopCompanion(ctx, r.sd, companionUnit("tpm", r.unit))
}

// stopCompanion stops a companion unit, if it runs.
func stopCompanion(ctx context.Context, sd *units.Manager, unit string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	_ = sd.Stop(uctx, unit)
	_ = sd.ResetFailed(uctx, unit)
}

// stopTPMs stops any swtpm of the VM once no QEMU of it runs (swtpm ends
// with its QEMU; this is for one whose QEMU never came, its start killed).
func (s *Supervisor) stopTPMs(ctx context.Context, name string) {
	sd, err := s.systemd(ctx)
	if err != nil {
		return
	}
	main := vmstate.UnitName(name)
	for _, u := range []string{main, vmstate.AltUnit(name, main)} {
		stopCompanion(ctx, sd, companionUnit("tpm", u))
	}
}
