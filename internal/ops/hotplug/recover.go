package hotplug

import (
	"context"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/qmp"
)

// Recovery of a hot-plug whose command died: what QEMU has is the truth. A
// device that made it into the guest is adopted (recorded); the parts of
// one that did not are removed, with its grants and the files its attach
// made. A detach the guest went along with is finished; a device the guest
// keeps stays attached.

// recoverAttach settles an attach of kind kd whose command died.
func (e *Engine) recoverAttach(kd kind) operation.Recoverer {
	return func(ctx context.Context, vm string, o *operation.Op) (string, error) {
		d, err := kd.load(e, vm, o)
		if err != nil {
			return "", err
		}
		app, err := e.state().ReadApplied(vm)
		if err != nil {
			return "", err
		}
		if d.Recorded(app) {
			return d.Label() + " was attached and recorded", nil
		}
		c, release, err := e.liveQMP(ctx, vm)
		if err != nil {
			return "", err
		}
		defer release()
		if c != nil {
			pr, err := e.query(ctx, c)
			if err != nil {
				return "", err
			}
			if present(pr, d) {
				// It made it into the guest: keep it, as the attach meant to.
				if err := d.Record(app, &pr); err != nil {
					return "", err
				}
				if err := e.state().RewriteApplied(app); err != nil {
					return "", fmt.Errorf("record: %w", err)
				}
				return d.Label() + " was plugged: adopted and recorded", nil
			}
			if err := d.RemoveParts(ctx, c, pr); err != nil {
				return "", err
			}
		}
		note, err := d.Undo(ctx)
		if err != nil {
			return "", err
		}
		return d.Label() + " had not reached the guest: " + note, nil
	}
}

// recoverDetach settles a detach of kind kd whose command died.
func (e *Engine) recoverDetach(kd kind) operation.Recoverer {
	return func(ctx context.Context, vm string, o *operation.Op) (string, error) {
		d, err := kd.load(e, vm, o)
		if err != nil {
			return "", err
		}
		app, err := e.state().ReadApplied(vm)
		if err != nil {
			return "", err
		}
		if !d.Recorded(app) {
			return d.Label() + " was detached and recorded", nil
		}
		c, release, err := e.liveQMP(ctx, vm)
		if err != nil {
			return "", err
		}
		defer release()
		if c != nil {
			pr, err := e.query(ctx, c)
			if err != nil {
				return "", err
			}
			if present(pr, d) {
				// The detach was meant: finish the unplug it may have begun.
				gone, err := e.finish(ctx, c, d.ID(), e.unplugTimeout())
				if err != nil {
					return "", err
				}
				if !gone {
					return d.Label() + " is still in the guest (it did not release it): it stays attached; detach it again", nil
				}
				if pr, err = e.query(ctx, c); err != nil {
					return "", err
				}
			}
			if err := d.RemoveParts(ctx, c, pr); err != nil {
				return "", err
			}
		}
		if err := e.remove(ctx, vm, d, nil); err != nil {
			return "", err
		}
		return d.Label() + " had left the guest: detach finished", nil
	}
}

// liveQMP is the running VM's monitor, or nil (no error) when QEMU is gone.
func (e *Engine) liveQMP(ctx context.Context, vm string) (*qmp.Conn, func(), error) {
	if _, err := os.Stat(e.state().Paths(vm).QMP); err != nil {
		return nil, func() {}, nil
	}
	return e.mon.QMPSession(ctx, vm)
}

// present reports whether QEMU (pr) has d's device.
func present(pr qdev.Present, d Device) bool { return d.ID() != "" && pr.Devices[d.ID()] }
