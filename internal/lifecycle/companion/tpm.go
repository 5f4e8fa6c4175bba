package companion

import (
	"context"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/vtpm"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// A VM's TPM: swtpm in a companion unit ("vmsup-tpm@NAME"), started just
// before each QEMU of the VM and ending with it (internal/lifecycle/vtpm).

// TPMPaths are the TPM files of the QEMU of vmUnit: each unit its own, so
// the two QEMUs of a local migration each have a swtpm.
func TPMPaths(p vmstore.Paths, vmUnit string) vtpm.Paths {
	a, _ := alt(vmUnit)
	return vtpm.PathsFor(p.Dir, a)
}

// startTPM prepares the TPM's state (manufactured at the VM's first start;
// a destination's comes in the migration stream) and starts swtpm as
// QEMU's user, in a sandbox that sees only its own directory.
func (c Companions) startTPM(ctx context.Context, f *spec.File, plan *startplan.Plan) error {
	b, err := vtpm.Find()
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	tp := TPMPaths(plan.Paths, plan.Unit)
	sb, uid, gid, err := c.user(f.VM.Name, plan.Paths)
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	if plan.Mode == startplan.IncomingLocal {
		// Left by an earlier migration; the live state comes in the stream
		// (this directory is never the running QEMU's: TPMPaths).
		if err := os.RemoveAll(tp.Dir); err != nil {
			return fmt.Errorf("tpm: %w", err)
		}
	}
	if err := vtpm.Prepare(ctx, b, tp, plan.Mode == startplan.Fresh, uid, gid); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	sd, err := c.Systemd(ctx)
	if err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	unit := unitName("tpm", plan.Unit)
	Stop(ctx, sd, unit) // a swtpm left by a start killed before its QEMU connected
	if err := sd.Start(ctx, vtpm.Unit(unit, f.VM.Name, plan.Unit, b, tp, sb)); err != nil {
		return fmt.Errorf("tpm: %w", err)
	}
	if err := c.waitSocket(ctx, sd, unit, tp.Socket); err != nil {
		return fmt.Errorf("tpm: swtpm %w", err)
	}
	return nil
}
