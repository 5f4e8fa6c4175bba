package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/vmsup/vmsup/units"
)

// Unit is the name of the endpoint's unit pair (.socket, @.service).
const Unit = "vmsup-metrics"

// CollectUnit is the name of the collector's unit pair.
const CollectUnit = "vmsup-metrics-collect"

// CollectSocket is where the collector listens.
const CollectSocket = "/run/vmsup-metrics.sock"

// user is the endpoint's dynamic user.
const user = "vmsup-metrics"

// instanceSeconds is RuntimeMaxSec= of one instance.
const instanceSeconds = 30

// collectorCaps are the collector's capabilities: read the root-only
// records and lock files, connect to QEMU users' monitor sockets (write
// permission on the socket: DAC_OVERRIDE), and read the taps of a VM in a
// network namespace (setns: SYS_ADMIN).
func collectorCaps() []string {
	return []string{"CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_SYS_ADMIN"}
}

// Install is what Endpoint.Install installs.
type Install struct {
	Listen   string // the endpoint's ListenStream= address, e.g. "127.0.0.1:9475"
	Self     string // the vmsup binary the units run (default the Env's Options.Self)
	WantedBy string // default "sockets.target"
}

// services are the endpoint's and the collector's unit pairs.
func (m Install) services(root string) (endpoint, collector units.SocketService) {
	wanted := cmp.Or(m.WantedBy, "sockets.target")
	collector = units.SocketService{Name: CollectUnit, Description: "vmsup metrics: every VM's figures, for the endpoint",
		Listen: CollectSocket, SocketMode: 0o666, MaxConnections: 8, MaxPerSource: 8,
		ExecStart: []string{m.Self, "--root", root, "metrics", "--collect"}, MaxSeconds: instanceSeconds, WantedBy: wanted,
		Sandbox: &units.Sandbox{Capabilities: collectorCaps(), Netlink: true, SeeProcesses: true,
			ReadOnlyBindPaths: []string{m.Self, root}}}
	endpoint = units.SocketService{Name: Unit, Description: "vmsup metrics: Prometheus endpoint, one vmsup run per scrape",
		Listen: m.Listen, MaxConnections: 64, MaxPerSource: 8,
		ExecStart: []string{m.Self, "metrics", "--http-via", CollectSocket}, MaxSeconds: instanceSeconds, WantedBy: wanted,
		Requires: []string{collector.SocketUnit()},
		Sandbox:  &units.Sandbox{User: user, DynamicUser: true, ReadOnlyBindPaths: []string{m.Self}}}
	return endpoint, collector
}

// UnitFiles are the four unit files Install would write for m, by file
// name, without installing anything (what a package ships, disabled).
func (e *Endpoint) UnitFiles(m Install) (map[string][]byte, error) {
	m.Self = cmp.Or(m.Self, e.o.Self)
	endpoint, collector := m.services(e.o.Root)
	files := map[string][]byte{}
	for _, svc := range []units.SocketService{collector, endpoint} {
		socket, service, err := svc.Files()
		if err != nil {
			return nil, fmt.Errorf("metrics units: %w", err)
		}
		files[svc.SocketUnit()], files[svc.ServiceUnit()] = socket, service
	}
	return files, nil
}

// Install installs both unit pairs into the Env's UnitDir and starts the
// sockets. An address in use or an installed pair is refused before
// anything is written; sockets systemd cannot start are removed again.
func (e *Endpoint) Install(ctx context.Context, m Install) error {
	if l, err := net.Listen("tcp", m.Listen); err != nil {
		return fmt.Errorf("--listen %s: %w", m.Listen, err)
	} else {
		l.Close()
	}
	m.Self = cmp.Or(m.Self, e.o.Self)
	endpoint, collector := m.services(e.o.Root)
	all := []units.SocketService{collector, endpoint}
	var done []units.SocketService
	undo := func(sd Systemd) {
		for _, svc := range done {
			_, _ = svc.Uninstall(e.o.UnitDir)
			if sd != nil {
				_ = sd.Stop(ctx, svc.SocketUnit())
				_ = sd.ResetFailed(ctx, svc.SocketUnit())
			}
		}
		if sd != nil {
			_ = sd.Reload(ctx)
		}
	}
	for _, svc := range all {
		if err := svc.Install(e.o.UnitDir); err != nil {
			undo(nil)
			if errors.Is(err, units.ErrInstalled) {
				return fmt.Errorf("metrics units: %w (vmsup metrics --uninstall removes them)", err)
			}
			return fmt.Errorf("metrics units in %s: %w", e.o.UnitDir, err)
		}
		done = append(done, svc)
	}
	sd, err := e.src.Systemd(ctx)
	if err == nil {
		if err = sd.Reload(ctx); err == nil {
			for _, svc := range all {
				if err = sd.StartUnit(ctx, svc.SocketUnit()); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		undo(sd)
		return fmt.Errorf("metrics socket %s: %w (nothing left installed)", m.Listen, err)
	}
	return nil
}

// Uninstall stops the sockets and removes both unit pairs (or the one pair
// an older vmsup installed).
func (e *Endpoint) Uninstall(ctx context.Context) error {
	endpoint, collector := Install{}.services(e.o.Root)
	sd, err := e.src.Systemd(ctx)
	if err != nil {
		return err
	}
	found := false
	for _, svc := range []units.SocketService{endpoint, collector} {
		if err := sd.Stop(ctx, svc.SocketUnit()); err != nil {
			return err
		}
		f, err := svc.Uninstall(e.o.UnitDir)
		if err != nil {
			return err
		}
		found = found || f
	}
	if !found {
		return fmt.Errorf("metrics units: none in %s", e.o.UnitDir)
	}
	return sd.Reload(ctx)
}
