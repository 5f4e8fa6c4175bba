package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/hostcaps"
	"github.com/vmsup/vmsup/internal/virtiofs"
	"github.com/vmsup/vmsup/spec"
)

// virtiofs shares: one virtiofsd per share in a companion unit
// ("vmsup-fs-TAG@NAME"), started before QEMU, ending with it
// (internal/virtiofs).

// StepVirtioFS is the start step that starts the shares' virtiofsd.
const StepVirtioFS = "virtiofs"

// errMigrateVirtioFS: QEMU 7.2 blocks migration of vhost-user-fs devices.
var errMigrateVirtioFS = errors.New("virtiofs shares cannot migrate (QEMU's vhost-user-fs has no migration support): down and up the VM instead")

// shareSockets are the virtiofs shares' sockets, by tag.
func shareSockets(dir string, vm *spec.VM) map[string]string {
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
func (r *startRun) startVirtioFS(ctx context.Context) error {
	bin, err := hostcaps.VirtioFSD()
	if err != nil {
		return err
	}
	sb, uid, gid, err := r.companionUser()
	if err != nil {
		return err
	}
	for i, sh := range r.f.VM.Shares {
		if sh.Driver != spec.ShareVirtioFS {
			continue
		}
		p := virtiofs.PathsFor(r.p.Dir, sh.Tag)
		if err := os.MkdirAll(p.Dir, 0o700); err != nil {
			return err
		}
		if err := os.Chown(p.Dir, uid, gid); err != nil {
			return err
		}
		if err := os.Remove(p.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		unit := companionUnit("fs-"+sh.Tag, r.plan.Unit)
		stopCompanion(ctx, r.sd, unit) // one left by a start killed before its QEMU came
		u := virtiofs.Unit(unit, r.name, r.plan.Unit, bin, sh, p, filepath.Dir(r.p.Dir), sb)
		if err := r.sd.Start(ctx, u); err != nil {
			return fmt.Errorf("share[%d] %s: virtiofsd: %w", i, sh.Tag, err)
		}
		if err := r.waitSocket(ctx, unit, p.Socket); err != nil {
			return fmt.Errorf("share[%d] %s: virtiofsd: %w", i, sh.Tag, err)
		}
	}
	return nil
}

func (r *startRun) stopVirtioFS(ctx context.Context) {
	for _, sh := range r.f.VM.Shares {
		if sh.Driver == spec.ShareVirtioFS {
			stopCompanion(ctx, r.sd, companionUnit("fs-"+sh.Tag, r.plan.Unit))
		}
	}
}

// companionReady bounds how long a companion takes to listen (swtpm:
// ~20 ms measured).
const companionReady = 10 * time.Second

// waitSocket waits until the companion unit listens on sock, or fails
// with its last words when it ends first.
func (r *startRun) waitSocket(ctx context.Context, unit, sock string) error {
	deadline := time.Now().Add(companionReady)
	for {
		if _, err := os.Stat(sock); err == nil {
			return nil
		}
		if st, err := r.sd.Status(ctx, unit); err == nil && st.Gone() || time.Now().After(deadline) {
			return fmt.Errorf("did not listen on %s: %s", sock, r.s.lastWords(ctx, unit))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
