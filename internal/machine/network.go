package machine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// The host side of NICs lives in internal/net/nics, with its part of a start
// (nics.Start); this is the exported API that predates the move.

// NetworkOptions say how VM NICs reach the host network. The zero value
// works on a stock host: taps owned by the QEMU user, OVS at its default
// socket, CNI plugins in the usual directories, namespaces in /run/netns.
type NetworkOptions = nics.Options

// NICStatus is one NIC as status shows it.
type NICStatus = nics.NICStatus

func (s *Env) Net() *nics.Manager {
	return &nics.Manager{Options: s.opts.Network, Store: s.state, Logger: s.opts.Logger, Networks: s.Networks()}
}

// Networks are the host's managed networks (vmsup network; internal/net/netmanage).
func (s *Env) Networks() *netmanage.Manager {
	return &netmanage.Manager{Dir: filepath.Join(s.state.Root, "networks"), Systemd: s.Systemd, Logger: s.opts.Logger, AfterStep: s.opts.AfterStep}
}

// TapOwner is the user the VM's QEMU runs as, who owns its taps.
func (s *Env) TapOwner(ctx context.Context, vm string) (nics.Owner, error) {
	_, uid, gid, err := s.Confiner().Identity(ctx, vm)
	return nics.Owner{UID: uid, GID: gid}, err
}

// validateNICs is the NIC check of Validate: the bridges, OVS bridges and
// CNI configs the NICs name must exist.
func (s *Env) validateNICs(ctx context.Context, f *spec.File) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return s.Net().Check(ctx, f)
}

// StopPost is the unit's ExecStopPost= hook ("vmsup stop-post NAME"): it
// removes the VM's taps, ports, CNI attachments and namespace, and its
// disks' secret copies, and gives its host PCI devices back, however QEMU ended (down, systemctl stop, crash). It runs inside the unit, so in the
// VM's namespace for cni VMs; it moves to the namespace of PID 1 (the
// host's, as systemd sees it) so CNI plugins find the host side there.
// It does not take the VM lock: Down holds it while it waits for the unit.
// Like StopHook it acts only for the VM's current unit: another one (a
// migration's other QEMU) shares the network with it.
func (s *Env) StopPost(ctx context.Context, name, unit string) error {
	if err := spec.ValidName(name); err != nil {
		return vmerr.Wrap(name, err)
	}
	if !s.isCurrentUnit(name, unit) {
		return nil
	}
	if _, err := os.Stat(s.Paths(name).Handover()); err == nil {
		// A local migration's old QEMU: the new one uses the network.
		return nil
	}
	run := func() error { return s.Net().Teardown(ctx, name, true) }
	var err error
	if netsetup.SameNetns("/proc/self/ns/net", "/proc/1/ns/net") {
		err = run()
	} else {
		err = netsetup.InNetns("/proc/1/ns/net", run)
	}
	// QEMU has read its disks' secrets: the copies go now, not at the next
	// down (a crashed VM would keep them).
	err = errors.Join(err, storage.Teardown(s.Paths(name).Dir))
	// Host PCI devices go back to their drivers once QEMU let them go, a
	// crash included.
	err = errors.Join(err, s.hostDevs().Teardown(name, s.Paths(name).HostDevs()))
	if err != nil {
		return vmerr.Wrap(name, fmt.Errorf("stop-post: %w", err))
	}
	return nil
}

// NICStatuses reports the host side of the VM's tap NICs.
func (s *Env) NICStatuses(ctx context.Context, name string) []NICStatus {
	return s.Net().Statuses(ctx, name)
}
