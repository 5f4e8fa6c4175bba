package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/google/renameio/v2"

	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// NetworkOptions say how VM NICs reach the host network. The zero value
// works on a stock host: taps owned by the QEMU user, OVS at its default socket, CNI
// plugins in the usual directories, namespaces in /run/netns.
type NetworkOptions struct {
	// OVSDB is the OVSDB server for ovs NICs ("unix:/path/db.sock"); ""
	// is ovs-vsctl's default.
	OVSDB string
	// CNIBinDirs are searched for CNI plugins; nil = netsetup.DefaultCNIBinDirs().
	CNIBinDirs []string
	// Netns makes the namespaces of VMs with cni NICs; nil =
	// netsetup.NamedNetns{Dir: "/run/netns"}.
	Netns netsetup.Netns
	// VhostNet overrides the /dev/vhost-net probe (tests); nil = probe.
	VhostNet *bool
}

// vhostNetDev is the device vhost-net needs; QEMU 7.2 aborts on vhost=on
// without it.
const vhostNetDev = "/dev/vhost-net"

// netState is what the network steps made for one VM, kept in
// Root/vms/NAME/net.json and written before each thing is made, so that
// teardown (from Down, the unit's ExecStopPost= hook, or the next up after a
// crash) works from it alone, without the spec or the options.
type netState struct {
	VM         string               `json:"vm"`
	NetnsName  string               `json:"netns_name,omitempty"`
	Netns      *netsetup.NetnsPaths `json:"netns,omitempty"`
	CNIBinDirs []string             `json:"cni_bin_dirs,omitempty"`
	CNICache   string               `json:"cni_cache,omitempty"`
	NICs       []nicState           `json:"nics"`
}

// nicState is one NIC's host side.
type nicState struct {
	Name   string                  `json:"name"`
	Type   string                  `json:"type"`
	Tap    string                  `json:"tap"`
	Bridge string                  `json:"bridge,omitempty"`
	OVSDB  string                  `json:"ovsdb,omitempty"`
	CNI    *netsetup.CNIAttachment `json:"cni,omitempty"`
	Result *netsetup.CNIResult     `json:"cni_result,omitempty"`
	// Bus is the root port of a hot-plugged NIC ("" for boot-time NICs).
	Bus string `json:"bus,omitempty"`
}

// The network record, its lock and libcni's cache are vmsup's (Records):
// the privileged stop-post hook deletes what net.json names.
func (p vmPaths) netState() string { return filepath.Join(p.Records, "net.json") }
func (p vmPaths) netLock() string  { return filepath.Join(p.Records, "net.lock") }
func (p vmPaths) cniCache() string { return filepath.Join(p.Records, "cni-cache") }

func readNetState(p vmPaths) (*netState, error) {
	b, err := os.ReadFile(p.netState())
	if err != nil {
		return nil, err
	}
	var st netState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", p.netState(), err)
	}
	return &st, nil
}

func writeNetState(p vmPaths, st *netState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := p.makeRecords(); err != nil {
		return err
	}
	return renameio.WriteFile(p.netState(), b, 0o600)
}

func (s *Supervisor) netnsMaker() netsetup.Netns {
	if s.opts.Network.Netns != nil {
		return s.opts.Network.Netns
	}
	return netsetup.NamedNetns{Dir: "/run/netns"}
}

func (s *Supervisor) vhostNet() bool {
	if v := s.opts.Network.VhostNet; v != nil {
		return *v
	}
	_, err := os.Stat(vhostNetDev)
	return err == nil
}

func (s *Supervisor) ovs(db string) netsetup.OVS { return netsetup.OVS{DB: db} }

func netnsName(vm string) string { return "vmsup-" + vm }

// networkSteps prepares the VM's NICs: a check of everything they refer to
// (nothing is made before it passes), the namespace for cni NICs, then one
// step per tap NIC. The unit gets /dev/net/tun, the namespace and the
// ExecStopPost= hook that tears it all down however QEMU ends.
func (s *Supervisor) networkSteps(f *spec.File, p vmPaths, plan *startPlan) []step {
	vm := &f.VM
	st := &netState{VM: vm.Name, CNIBinDirs: s.opts.Network.CNIBinDirs, CNICache: p.cniCache()}
	vhost := s.vhostNet() // s.argv gives QEMU the same answer
	plan.unitOpts = append(plan.unitOpts, func(u *units.Unit) {
		u.DeviceAllow = append(u.DeviceAllow, units.DeviceRule{Path: "/dev/net/tun", Access: "rw"})
		if vhost {
			u.DeviceAllow = append(u.DeviceAllow, units.DeviceRule{Path: vhostNetDev, Access: "rw"})
		}
		u.ExecStopPost = append(u.ExecStopPost, []string{s.opts.Self, "stop-post", "--root", s.opts.Root, vm.Name})
		// The hook removes taps and takes back file grants: it needs root
		// even though QEMU runs unprivileged.
		u.ExecStopPostPrivileged = true
		if st.Netns != nil {
			u.NetworkNamespacePath = st.Netns.Unit
		}
	})
	steps := []step{{name: "net-check", do: func(ctx context.Context) error {
		// A run that crashed before its hook could clean up left its
		// taps, ports and namespace behind: remove them first.
		if _, err := os.Stat(p.netState()); err == nil {
			s.opts.Logger.Info("removing the network left by a previous run", "vm", vm.Name)
			if err := s.networkTeardown(ctx, vm.Name); err != nil {
				return fmt.Errorf("network left by a previous run: %w", err)
			}
		}
		return s.checkNICs(ctx, f, vhost)
	}}}
	needNetns := false
	for _, n := range vm.NICs {
		needNetns = needNetns || n.Type == spec.NICCNI
	}
	if needNetns {
		steps = append(steps, step{name: "netns", do: func(ctx context.Context) error {
			name := netnsName(vm.Name)
			m := s.netnsMaker()
			st.NetnsName = name
			paths := m.Paths(name)
			st.Netns = &paths
			if err := writeNetState(p, st); err != nil {
				return err
			}
			got, err := m.Create(ctx, name)
			if errors.Is(err, netsetup.ErrExists) {
				s.opts.Logger.Info("removing a stale network namespace", "vm", vm.Name, "netns", name)
				if err := m.Delete(ctx, name); err != nil {
					return err
				}
				got, err = m.Create(ctx, name)
			}
			if err != nil {
				return fmt.Errorf("network namespace %s: %w", name, err)
			}
			*st.Netns = got
			return writeNetState(p, st)
		}, undo: func(ctx context.Context) { s.networkTeardown(ctx, vm.Name) }})
	}
	for _, n := range vm.NICs {
		if !n.UsesTap() {
			continue
		}
		steps = append(steps, step{name: fmt.Sprintf("nic %q", n.Name), do: func(ctx context.Context) error {
			return s.nicUp(ctx, vm.Name, n, "", st)
		}, undo: func(ctx context.Context) { s.networkTeardown(ctx, vm.Name) }})
	}
	return steps
}

// validateNICs is checkNICs for Validate, which has no context: the
// bridges, OVS bridges and CNI configs the NICs name must exist.
func (s *Supervisor) validateNICs(f *spec.File) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.checkNICs(ctx, f, s.vhostNet())
}

// checkNICs checks what the NICs refer to on this host, before anything
// is made; errors name the NIC and its field.
func (s *Supervisor) checkNICs(ctx context.Context, f *spec.File, vhost bool) error {
	for i, n := range f.VM.NICs {
		field := func(name string) string { return fmt.Sprintf("nic[%d].%s", i, name) }
		if err := s.checkNIC(ctx, n, vhost); err != nil {
			var fe *nicFieldError
			if errors.As(err, &fe) {
				return f.Errorf(field(fe.field), "nic %q: %v", n.Name, fe.err)
			}
			return f.Errorf(field("type"), "nic %q: %v", n.Name, err)
		}
	}
	return nil
}

type nicFieldError struct {
	field string
	err   error
}

func (e *nicFieldError) Error() string { return e.field + ": " + e.err.Error() }
func (e *nicFieldError) Unwrap() error { return e.err }

func (s *Supervisor) checkNIC(ctx context.Context, n spec.NIC, vhost bool) error {
	if n.Vhost == spec.VhostOn && !vhost {
		return &nicFieldError{"vhost", fmt.Errorf("vhost \"on\" needs %s, which this host does not have", vhostNetDev)}
	}
	switch n.Type {
	case spec.NICBridge:
		if _, err := netsetup.CheckBridge(n.Bridge); err != nil {
			return &nicFieldError{"bridge", err}
		}
	case spec.NICOVS:
		if err := s.ovs(s.opts.Network.OVSDB).CheckBridge(ctx, n.Bridge); err != nil {
			return &nicFieldError{"bridge", err}
		}
	case spec.NICCNI:
		cni := netsetup.CNI{BinDirs: s.opts.Network.CNIBinDirs}
		if _, err := cni.Load(ctx, n.CNIConfig); err != nil {
			return &nicFieldError{"cni_config", err}
		}
	}
	return nil
}

// nicUp makes the host side of one tap NIC and records it in st (and
// net.json) before making it. bus is the root port of a hot-plugged NIC.
func (s *Supervisor) nicUp(ctx context.Context, vm string, n spec.NIC, bus string, st *netState) error {
	p := s.paths(vm)
	ns := nicState{Name: n.Name, Type: n.Type, Tap: n.Tap, Bridge: n.Bridge, Bus: bus}
	if n.Type == spec.NICOVS {
		ns.OVSDB = s.opts.Network.OVSDB
	}
	if n.Type == spec.NICCNI {
		if st.Netns == nil {
			return fmt.Errorf("nic %q: the VM has no network namespace (cni NICs need one made at start)", n.Name)
		}
		ns.CNI = &netsetup.CNIAttachment{Config: n.CNIConfig, ContainerID: "vmsup-" + vm, IfName: netsetup.CNIIfName(n.Name)}
	}
	st.NICs = append(st.NICs, ns)
	idx := len(st.NICs) - 1
	if err := writeNetState(p, st); err != nil {
		return err
	}
	mac, _ := net.ParseMAC(n.MAC)
	// The tap belongs to the user QEMU runs as (security.go), so the
	// unprivileged QEMU can open it by name.
	_, uid, gid, err := s.qemuIdentity(ctx, vm)
	if err != nil {
		return fmt.Errorf("nic %q: %w", n.Name, err)
	}
	tap := netsetup.Tap{Name: n.Tap, Owner: uid, Group: gid, MTU: n.MTU, GuestMAC: mac, Queues: n.Queues}
	err = func() error {
		switch n.Type {
		case spec.NICBridge:
			if tap.MTU == 0 {
				mtu, err := netsetup.CheckBridge(n.Bridge)
				if err != nil {
					return err
				}
				tap.MTU = mtu
			}
			if err := s.createTap(vm, tap); err != nil {
				return err
			}
			return netsetup.AttachBridge(tap.Name, n.Bridge)
		case spec.NICOVS:
			if err := s.createTap(vm, tap); err != nil {
				return err
			}
			removed, err := s.ovs(ns.OVSDB).AddPort(ctx, n.Bridge, tap.Name, vm)
			if len(removed) > 0 {
				s.opts.Logger.Warn("removed stale OVS ports", "vm", vm, "nic", n.Name, "ports", removed)
			}
			return err
		case spec.NICCNI:
			a := *ns.CNI
			a.Netns = st.Netns.Host
			cni := netsetup.CNI{BinDirs: st.CNIBinDirs, CacheDir: st.CNICache}
			res, err := cni.Add(ctx, a)
			if err != nil {
				return err
			}
			st.NICs[idx].Result = &res
			if err := writeNetState(p, st); err != nil {
				return err
			}
			return netsetup.WireTap(a.Netns, tap, a.IfName)
		}
		return fmt.Errorf("type %q has no tap", n.Type)
	}()
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		if derr := s.nicDown(uctx, st, st.NICs[idx], false); derr != nil {
			s.opts.Logger.Warn("undo NIC", "vm", vm, "nic", n.Name, "err", derr)
		}
		st.NICs = st.NICs[:idx]
		writeNetState(p, st)
		return err // the step's name names the NIC
	}
	return nil
}

// createTap makes the tap, replacing a stale one of the same name (the
// name is derived from the VM and NIC, so a leftover is this VM's own).
func (s *Supervisor) createTap(vm string, t netsetup.Tap) error {
	err := netsetup.CreateTap(t)
	if errors.Is(err, netsetup.ErrExists) {
		if !netsetup.IsTap(t.Name) {
			return fmt.Errorf("tap %s: a link of that name exists and is not a tap; not touching it", t.Name)
		}
		s.opts.Logger.Warn("removing a stale tap", "vm", vm, "tap", t.Name)
		if err := netsetup.DeleteTap(t.Name); err != nil {
			return err
		}
		err = netsetup.CreateTap(t)
	}
	return err
}

// nicDown removes one NIC's host side. inUnit: running as the unit's
// ExecStopPost= hook, which sees namespaces at their unit paths.
func (s *Supervisor) nicDown(ctx context.Context, st *netState, n nicState, inUnit bool) error {
	switch n.Type {
	case spec.NICBridge:
		return netsetup.DeleteTap(n.Tap)
	case spec.NICOVS:
		if netsetup.LinkExists(n.Tap) && !netsetup.IsTap(n.Tap) {
			return fmt.Errorf("tap %s: the link of that name is not a tap; left alone with its OVS port", n.Tap)
		}
		return errors.Join(s.ovs(n.OVSDB).DelPort(ctx, n.Tap), netsetup.DeleteTap(n.Tap))
	case spec.NICCNI:
		if n.CNI == nil || st.Netns == nil {
			return nil
		}
		a := *n.CNI
		a.Netns = st.Netns.Host
		if inUnit {
			a.Netns = st.Netns.Unit
		}
		var errs []error
		if _, err := os.Stat(a.Netns); err == nil {
			errs = append(errs, netsetup.InNetns(a.Netns, func() error { return netsetup.DeleteTap(n.Tap) }))
		} else {
			a.Netns = "" // gone: DEL still releases the address
		}
		cni := netsetup.CNI{BinDirs: st.CNIBinDirs, CacheDir: st.CNICache}
		errs = append(errs, cni.Del(ctx, a))
		return errors.Join(errs...)
	}
	return nil
}

// networkTeardown undoes networkSteps (and hot-plugged NICs) once QEMU is
// gone; idempotent.
func (s *Supervisor) networkTeardown(ctx context.Context, name string) error {
	return s.teardownNet(ctx, name, false)
}

func (s *Supervisor) teardownNet(ctx context.Context, name string, inUnit bool) error {
	p := s.paths(name)
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := os.Stat(p.Records); err != nil {
		return nil
	}
	lk, ok, err := lockFile(lctx, p.netLock(), true)
	if err != nil || !ok {
		return fmt.Errorf("network lock: %v", orDefault(fmt.Sprint(err), "timed out"))
	}
	defer lk.unlock()
	st, err := readNetState(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for i := len(st.NICs) - 1; i >= 0; i-- {
		if err := s.nicDown(ctx, st, st.NICs[i], inUnit); err != nil {
			errs = append(errs, fmt.Errorf("nic %q: %w", st.NICs[i].Name, err))
		}
	}
	if st.Netns != nil {
		var err error
		if inUnit {
			err = netsetup.DeleteNetnsPath(st.Netns.Unit)
		} else {
			err = s.netnsMaker().Delete(ctx, st.NetnsName)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	os.RemoveAll(p.cniCache())
	if err := os.Remove(p.netState()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// StopPost is the unit's ExecStopPost= hook ("vmsup stop-post NAME"): it
// removes the VM's taps, ports, CNI attachments and namespace however QEMU
// ended (down, systemctl stop, crash). It runs inside the unit, so in the
// VM's namespace for cni VMs; it moves to the namespace of PID 1 (the
// host's, as systemd sees it) so CNI plugins find the host side there.
// It does not take the VM lock: Down holds it while it waits for the unit.
func (s *Supervisor) StopPost(ctx context.Context, name string) error {
	if err := spec.ValidName(name); err != nil {
		return fmt.Errorf("vm %q: %w", name, err)
	}
	if _, err := os.Stat(s.paths(name).handover()); err == nil {
		// A local migration's old QEMU: the new one uses the network.
		return nil
	}
	run := func() error { return s.teardownNet(ctx, name, true) }
	var err error
	if netsetup.SameNetns("/proc/self/ns/net", "/proc/1/ns/net") {
		err = run()
	} else {
		err = netsetup.InNetns("/proc/1/ns/net", run)
	}
	if err != nil {
		return fmt.Errorf("vm %q: stop-post: %w", name, err)
	}
	return nil
}

// NICStatus is one NIC as status shows it.
type NICStatus struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`
	Tap      string   `json:"tap"`
	Bridge   string   `json:"bridge,omitempty"`    // the bridge the tap is on now ("" if none)
	TapUp    bool     `json:"tap_present"`         // the tap exists
	Addrs    []string `json:"addresses,omitempty"` // cni: what ADD gave the guest
	Gateway  string   `json:"gateway,omitempty"`
	CNICheck string   `json:"cni_check,omitempty"` // cni: "ok" or CHECK's error
	Hotplug  bool     `json:"hotplugged,omitempty"`
}

// nicStatuses reports the host side of the VM's tap NICs from net.json,
// checked against the kernel, OVS and CNI CHECK.
func (s *Supervisor) nicStatuses(ctx context.Context, name string) []NICStatus {
	st, err := readNetState(s.paths(name))
	if err != nil {
		return nil
	}
	var out []NICStatus
	for _, n := range st.NICs {
		ns := NICStatus{Name: n.Name, Type: n.Type, Tap: n.Tap, Hotplug: n.Bus != ""}
		switch n.Type {
		case spec.NICBridge:
			ns.TapUp = netsetup.LinkExists(n.Tap)
			ns.Bridge, _ = netsetup.LinkMaster(n.Tap)
		case spec.NICOVS:
			ns.TapUp = netsetup.LinkExists(n.Tap)
			ns.Bridge, _ = s.ovs(n.OVSDB).PortBridge(ctx, n.Tap)
		case spec.NICCNI:
			if st.Netns == nil || n.CNI == nil {
				break
			}
			_ = netsetup.InNetns(st.Netns.Host, func() error { ns.TapUp = netsetup.LinkExists(n.Tap); return nil })
			if n.Result != nil {
				ns.Addrs, ns.Gateway = n.Result.Addresses, n.Result.Gateway
			}
			a := *n.CNI
			a.Netns = st.Netns.Host
			ns.CNICheck = "ok"
			if err := (netsetup.CNI{BinDirs: st.CNIBinDirs, CacheDir: st.CNICache}).Check(ctx, a); err != nil {
				ns.CNICheck = err.Error()
			}
		}
		out = append(out, ns)
	}
	return out
}
