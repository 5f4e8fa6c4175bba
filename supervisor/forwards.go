package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// A local migration's new QEMU starts while the old one still holds the
// host ports of the user NICs' forwards, so it starts without them and
// takes them over once the old QEMU has quit (QMP has no hostfwd command:
// HMP hostfwd_add, as libvirt and Proxmox do for slirp).

// withoutForwards is f with its NICs' host forwards left out.
func withoutForwards(f *spec.File) *spec.File {
	g := *f
	g.VM.NICs = append([]spec.NIC(nil), f.VM.NICs...)
	for i := range g.VM.NICs {
		g.VM.NICs[i].Forwards = nil
	}
	return &g
}

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

// checkForwardPorts finds the user NICs' host ports that something on this
// host holds already, which QEMU would fail to bind at start. Skipped for a
// VM whose QEMU runs (it holds them) or lives in a network namespace.
func (s *Supervisor) checkForwardPorts(f *spec.File) error {
	if _, err := os.Stat(s.paths(f.VM.Name).QMP); err == nil {
		return nil
	}
	for _, n := range f.VM.NICs {
		if n.Type == spec.NICCNI {
			return nil
		}
	}
	var errs []error
	for i, n := range f.VM.NICs {
		if f.Broken(fmt.Sprintf("nic[%d]", i)) {
			continue
		}
		for k, fw := range n.Forwards {
			proto, host, port := spec.ForwardHost(fw)
			if port == "0" {
				continue
			}
			addr := net.JoinHostPort(host, port)
			var err error
			if proto == "udp" {
				var c net.PacketConn
				if c, err = net.ListenPacket("udp4", addr); err == nil {
					c.Close()
				}
			} else {
				var l net.Listener
				if l, err = net.Listen("tcp4", addr); err == nil {
					l.Close()
				}
			}
			field := fmt.Sprintf("nic[%d].forwards[%d]", i, k)
			switch {
			case errors.Is(err, syscall.EADDRINUSE):
				errs = append(errs, f.Errorf(field, "host port %s/%s is in use on this host (QEMU could not bind it)", port, proto))
			case err != nil:
				errs = append(errs, f.Errorf(field, "host port %s/%s can't be bound here: %v", port, proto, err))
			}
		}
	}
	return f.Join(errs...)
}
