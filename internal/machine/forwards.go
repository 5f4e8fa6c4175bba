package machine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/vmsup/vmsup/spec"
)

// A local migration's new QEMU starts while the old one still holds the
// host ports of the user NICs' forwards, so it starts without them and
// takes them over once the old QEMU has quit (internal/ops/livemigrate).

// withoutForwards is f with its NICs' host forwards left out.
func withoutForwards(f *spec.File) *spec.File {
	g := *f
	g.VM.NICs = append([]spec.NIC(nil), f.VM.NICs...)
	for i := range g.VM.NICs {
		g.VM.NICs[i].Forwards = nil
	}
	return &g
}

// checkForwardPorts finds the user NICs' host ports that something on this
// host holds already, which QEMU would fail to bind at start. Skipped for a
// VM whose QEMU runs (it holds them) or lives in a network namespace.
func (s *Env) checkForwardPorts(f *spec.File) error {
	if _, err := os.Stat(s.Paths(f.VM.Name).QMP); err == nil {
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
