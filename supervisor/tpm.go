package supervisor

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/internal/vtpm"
)

// A VM's TPM: swtpm in a companion unit ("vmsup-tpm@NAME"), started just
// before each QEMU of the VM and ending with it (internal/vtpm).

// StepTPM is the start step that starts the VM's swtpm.
const StepTPM = "tpm"

// tpmPaths are the TPM files of the QEMU of vmUnit: each unit its own, so
// the two QEMUs of a local migration each have a swtpm.
func tpmPaths(p vmstate.Paths, vmUnit string) vtpm.Paths {
	_, alt, _ := strings.Cut(strings.TrimSuffix(vmUnit, ".service"), "@")
	return vtpm.PathsFor(p.Dir, alt)
}

// startTPM prepares the TPM's state (manufactured at the VM's first start;
// a destination's comes in the migration stream) and starts swtpm as
// QEMU's user, in a sandbox that sees only its own directory.
func (r *startRun) startTPM(ctx context.Context) error {
	b, err := vtpm.Find()
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	tp := tpmPaths(r.p, r.plan.Unit)
	sb, uid, gid, err := r.companionUser()
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
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
	unit := companionUnit("tpm", r.plan.Unit)
	stopCompanion(ctx, r.sd, unit) // a swtpm left by a start killed before its QEMU connected
	if err := r.sd.Start(ctx, vtpm.Unit(unit, r.name, r.plan.Unit, b, tp, sb)); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	if err := r.waitSocket(ctx, unit, tp.Socket); err != nil {
		return fmt.Errorf("tpm: swtpm %w", err)
	}
	return nil
}

func (r *startRun) stopTPM(ctx context.Context) {
	stopCompanion(ctx, r.sd, companionUnit("tpm", r.plan.Unit))
}
