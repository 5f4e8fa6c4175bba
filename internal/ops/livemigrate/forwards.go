package livemigrate

import (
	"context"
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// A local migration's new QEMU starts while the old one still holds the
// host ports of the user NICs' forwards, so it starts without them (the
// start pipeline leaves them out) and takes them over once the old QEMU
// has quit (QMP has no hostfwd command: HMP hostfwd_add, as libvirt and
// Proxmox do for slirp).

// addForwards gives the running QEMU (monitor c) the forwards of vm's user
// NICs. again: a recovery, which may find some already added; their
// failure is then only reported in the returned note.
func addForwards(ctx context.Context, c *qmp.Conn, vm *spec.VM, again bool) (string, error) {
	var failed []string
	for _, n := range vm.NICs {
		if n.Type != spec.NICUser {
			continue
		}
		for _, fw := range n.Forwards {
			out, err := c.HumanMonitorCommand(ctx, "hostfwd_add "+qemuargs.NetdevID(n.Name)+" "+fw)
			if err == nil && strings.TrimSpace(out) != "" {
				err = fmt.Errorf("%s", strings.TrimSpace(out)) // HMP reports failure as text
			}
			if err != nil {
				if !again {
					return "", fmt.Errorf("nic %q: forward %s: %w", n.Name, fw, err)
				}
				failed = append(failed, fw)
			}
		}
	}
	if len(failed) > 0 {
		return "forwards not (re)added, maybe present already: " + strings.Join(failed, ", "), nil
	}
	return "", nil
}
