package nics

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
)

// errNoNetworks: a Manager without managed networks was asked for one.
var errNoNetworks = errors.New("managed networks are not available here")

// managedUp makes a network NIC's host side: its address and names on
// the managed network (netmanage), its filter, then its tap, attached to
// the network's bridge only once the filter is in place.
func (m *Manager) managedUp(ctx context.Context, vm string, n spec.NIC, tap netsetup.Tap, st *Record) error {
	if m.Networks == nil {
		return errNoNetworks
	}
	a, err := m.Networks.Attach(ctx, vm, n)
	if err != nil {
		return err
	}
	if err := netmanage.Filter(a, n.AllowSpoofing, spec.PickGroups(st.SecurityGroups, n.SecurityGroups)); err != nil {
		return err
	}
	if tap.MTU == 0 {
		mtu, err := netsetup.CheckBridge(a.Bridge)
		if err != nil {
			return err
		}
		tap.MTU = mtu
	}
	if err := m.createTap(vm, tap); err != nil {
		return err
	}
	return netsetup.AttachBridge(tap.Name, a.Bridge)
}

// managedDown removes a network NIC's tap, then its filter, names and
// address; and the same of its next tap, if a local migration was under
// way (its files, if a killed hand-over had moved them to it).
func (m *Manager) managedDown(ctx context.Context, n NICRecord) error {
	var errs []error
	for _, tap := range []string{n.Next, n.Tap} {
		if tap == "" {
			continue
		}
		errs = append(errs, netsetup.DeleteTap(tap))
		if m.Networks == nil {
			errs = append(errs, nicfilter.Remove(tap))
		} else {
			errs = append(errs, m.Networks.Release(ctx, n.Network, tap))
		}
	}
	return errors.Join(errs...)
}

// managedStatus fills a network NIC's status: its address, bridge, filter
// and drop counters.
func (m *Manager) managedStatus(n NICRecord, ns *NICStatus) {
	ns.TapUp = netsetup.LinkExists(n.Tap)
	ns.Bridge, _ = netsetup.LinkMaster(n.Tap)
	ns.Network, ns.AntiSpoofing, ns.SecurityGroups = n.Network, !n.AllowSpoofing, n.SecurityGroups
	if m.Networks != nil {
		if a, err := m.Networks.Lookup(n.Network, n.Tap); err == nil {
			ns.Addrs = []string{a.IP}
			if a.IPv6 != "" {
				ns.Addrs = append(ns.Addrs, a.IPv6)
			}
		}
		if nw, err := m.Networks.Get(n.Network); err == nil {
			ns.Gateway = nw.Gateway().String()
		}
	}
	if c, err := nicfilter.Read(n.Tap); err == nil {
		ns.Dropped = &c
	}
}

// SetFilters gives the running VM's network NICs the filters vm says
// (its security groups and each NIC's groups and anti-spoofing), live:
// each tap's tables are replaced in one transaction. NICs vm does not
// have (attached by hand) keep their groups, with vm's definitions.
func (m *Manager) SetFilters(ctx context.Context, name string, vm *spec.VM) error {
	if m.Networks == nil {
		return errNoNetworks
	}
	p := m.Store.Paths(name)
	st, err := ReadRecord(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	st.SecurityGroups = vm.SecurityGroups
	var errs []error
	for i := range st.NICs {
		r := &st.NICs[i]
		if r.Type != spec.NICNetwork {
			continue
		}
		if j := slices.IndexFunc(vm.NICs, func(n spec.NIC) bool { return n.Name == r.Name }); j >= 0 {
			r.AllowSpoofing, r.SecurityGroups = vm.NICs[j].AllowSpoofing, vm.NICs[j].SecurityGroups
		}
		a, err := m.Networks.Lookup(r.Network, r.Tap)
		if err == nil {
			err = netmanage.Filter(a, r.AllowSpoofing, spec.PickGroups(st.SecurityGroups, r.SecurityGroups))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("nic %q: filter: %w", r.Name, err))
		}
	}
	return errors.Join(append(errs, WriteRecord(p, st))...)
}
