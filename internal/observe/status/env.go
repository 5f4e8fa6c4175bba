package status

import (
	"context"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/guestagent"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/qmp"
)

// envSeam is status's systemd and QEMU: the Env's. Its systemd is a
// *units.Manager, which the seam's methods return as the smaller
// interfaces status asks of it.
type envSeam struct{ env *machine.Env }

func (e envSeam) Systemd(ctx context.Context) (Systemd, error) {
	sd, err := e.env.Systemd(ctx)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return sd, nil
}

func (e envSeam) Monitor(ctx context.Context, name string) (Monitor, func(), error) {
	c, release, err := e.env.QMPSession(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	return qmpMonitor{c, e.env, name}, release, nil
}

func (e envSeam) GuestPing(ctx context.Context, name string) (guestagent.AgentStatus, error) {
	return e.env.GuestPing(ctx, name)
}

func (e envSeam) Confinement(ctx context.Context, name, unit string, mainPID uint32, detail bool) *confine.Status {
	sd, err := e.env.Systemd(ctx) // the connection Systemd made
	if err != nil {
		return nil
	}
	return e.env.ConfinementStatus(ctx, sd, name, unit, mainPID, detail)
}

// qmpMonitor is a VM's QMP session as status uses it: the agent's ping
// goes over the session status holds (QEMU serves one client at a time).
type qmpMonitor struct {
	*qmp.Conn
	env  *machine.Env
	name string
}

func (m qmpMonitor) PingAgent(ctx context.Context) (guestagent.AgentStatus, error) {
	return m.env.Guest().PingOn(ctx, m.name, m.Conn)
}
