package companion

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/virtiofs"
	"github.com/vmsup/vmsup/spec"
)

// virtiofs shares: one virtiofsd per share in a companion unit
// ("vmsup-fs-TAG@NAME"), started before QEMU, ending with it
// (internal/lifecycle/virtiofs).

// ErrMigrateVirtioFS: QEMU 7.2 blocks migration of vhost-user-fs devices.
var ErrMigrateVirtioFS = errors.New("virtiofs shares cannot migrate (QEMU's vhost-user-fs has no migration support): down and up the VM instead")

// ShareSockets are the virtiofs shares' sockets in the state directory
// dir, by tag.
func ShareSockets(dir string, vm *spec.VM) map[string]string {
	var out map[string]string
	for _, sh := range vm.Shares {
		if sh.Driver == spec.ShareVirtioFS {
			if out == nil {
				out = map[string]string{}
			}
			out[sh.Tag] = virtiofs.PathsFor(dir, sh.Tag).Socket
		}
	}
	return out
}

// startVirtioFS starts each virtiofs share's virtiofsd as QEMU's user and
// waits until it listens.
func (c Companions) startVirtioFS(ctx context.Context, f *spec.File, plan *startplan.Plan) error {
	bin, err := caps.VirtioFSD()
	if err != nil {
		return err
	}
	sb, uid, gid, err := c.user(f.VM.Name, plan.Paths)
	if err != nil {
		return err
	}
	sd, err := c.Systemd(ctx)
	if err != nil {
		return err
	}
	for i, sh := range f.VM.Shares {
		if sh.Driver != spec.ShareVirtioFS {
			continue
		}
		p := virtiofs.PathsFor(plan.Paths.Dir, sh.Tag)
		if err := os.MkdirAll(p.Dir, 0o700); err != nil {
			return err
		}
		if err := os.Chown(p.Dir, uid, gid); err != nil {
			return err
		}
		if err := os.Remove(p.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		unit := unitName("fs-"+sh.Tag, plan.Unit)
		Stop(ctx, sd, unit) // one left by a start killed before its QEMU came
		u := virtiofs.Unit(unit, f.VM.Name, plan.Unit, bin, sh, p, filepath.Dir(plan.Paths.Dir), sb)
		if err := sd.Start(ctx, u); err != nil {
			return fmt.Errorf("share[%d] %s: virtiofsd: %w", i, sh.Tag, err)
		}
		if err := c.waitSocket(ctx, sd, unit, p.Socket); err != nil {
			return fmt.Errorf("share[%d] %s: virtiofsd: %w", i, sh.Tag, err)
		}
	}
	return nil
}

func (c Companions) stopVirtioFS(ctx context.Context, f *spec.File, plan *startplan.Plan) {
	for _, sh := range f.VM.Shares {
		if sh.Driver == spec.ShareVirtioFS {
			c.stop(ctx, unitName("fs-"+sh.Tag, plan.Unit))
		}
	}
}
