// Package vmnet is the host side of a VM's NICs over the VM's life: the
// network namespace of a VM with CNI NICs, one tap per NIC on its bridge,
// OVS bridge or CNI network, all recorded (ROOT/records/NAME/net.json)
// before each is made, so that teardown works from the record alone,
// however QEMU ended (down, systemctl stop through the unit's stop-post
// hook, a crash found by the next up). Boot and hot-plug use the same
// per-NIC code (NICUp, Forget). netsetup does the kernel and OVS/CNI work.
package nics

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/internal/net/nicfilter"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Options say how VM NICs reach the host network. The zero value
// works on a stock host: taps owned by the QEMU user, OVS at its default socket, CNI
// plugins in the usual directories, namespaces in /run/netns.
type Options struct {
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

// Manager makes and removes the host side of VMs' NICs.
type Manager struct {
	Options
	Store  vmstore.Store
	Logger *slog.Logger
	// Networks are the managed networks network NICs are on (nil: none
	// can be used).
	Networks *netmanage.Manager
}

// undoTimeout bounds the removal of a half-made NIC.
const undoTimeout = 20 * time.Second

// Owner is who a tap belongs to: the user QEMU runs as opens it by name.
type Owner struct{ UID, GID uint32 }

// vhostNetDev is the device vhost-net needs; QEMU 7.2 aborts on vhost=on
// without it.
const vhostNetDev = "/dev/vhost-net"

// Record is what the network steps made for one VM, kept in
// Root/vms/NAME/net.json and written before each thing is made, so that
// teardown (from Down, the unit's ExecStopPost= hook, or the next up after a
// crash) works from it alone, without the spec or the options.
type Record struct {
	VM         string               `json:"vm"`
	NetnsName  string               `json:"netns_name,omitempty"`
	Netns      *netsetup.NetnsPaths `json:"netns,omitempty"`
	CNIBinDirs []string             `json:"cni_bin_dirs,omitempty"`
	CNICache   string               `json:"cni_cache,omitempty"`
	NICs       []NICRecord          `json:"nics"`
	// SecurityGroups are the VM's groups its network NICs name (the
	// file's, as apply last set them).
	SecurityGroups []spec.SecurityGroup `json:"security_groups,omitempty"`
}

// NICRecord is one NIC's host side.
type NICRecord struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Tap  string `json:"tap"`
	// Next is the tap a local migration's new QEMU opens, on the same
	// bridge, until the hand-over makes it Tap (move.go).
	Next   string                  `json:"next_tap,omitempty"`
	Bridge string                  `json:"bridge,omitempty"`
	OVSDB  string                  `json:"ovsdb,omitempty"`
	CNI    *netsetup.CNIAttachment `json:"cni,omitempty"`
	Result *netsetup.CNIResult     `json:"cni_result,omitempty"`
	// Bus is the root port of a hot-plugged NIC ("" for boot-time NICs).
	Bus string `json:"bus,omitempty"`
	// Network NICs: the managed network, and the filter the NIC has.
	Network        string   `json:"network,omitempty"`
	AllowSpoofing  bool     `json:"allow_spoofing,omitempty"`
	SecurityGroups []string `json:"security_groups,omitempty"`
}

// ReadRecord reads the VM's network record; os.ErrNotExist if it has none.
func ReadRecord(p vmstore.Paths) (*Record, error) {
	b, err := os.ReadFile(p.NetState())
	if err != nil {
		return nil, err
	}
	var st Record
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("%s: %w", p.NetState(), err)
	}
	return &st, nil
}

// WriteRecord stores the VM's network record.
func WriteRecord(p vmstore.Paths, st *Record) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := p.MakeRecords(); err != nil {
		return err
	}
	return atomicfile.WriteFile(p.NetState(), b, 0o600)
}

func (m *Manager) netnsMaker() netsetup.Netns {
	if m.Netns != nil {
		return m.Netns
	}
	return netsetup.NamedNetns{Dir: "/run/netns"}
}

func (m *Manager) Vhost() bool {
	if v := m.VhostNet; v != nil {
		return *v
	}
	_, err := os.Stat(vhostNetDev)
	return err == nil
}

func (m *Manager) ovs(db string) netsetup.OVS { return netsetup.OVS{DB: db} }

func netnsName(vm string) string { return "vmsup-" + vm }

// Check checks what the NICs refer to on this host, before anything
// is made; errors name the NIC and its field, one per NIC (f.Join). NICs
// with a problem in the file itself (f.Broken) are skipped.
func (m *Manager) Check(ctx context.Context, f *spec.File) error {
	vhost := m.Vhost()
	var errs []error
	for i, n := range f.VM.NICs {
		field := func(name string) string { return fmt.Sprintf("nic[%d].%s", i, name) }
		if f.Broken(fmt.Sprintf("nic[%d]", i)) {
			continue // the file's own error says what is wrong with it
		}
		if err := m.checkNIC(ctx, f.VM.Name, n, vhost); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				errs = append(errs, f.Errorf(field(fe.Field), "nic %q: %v", n.Name, fe.Err))
				continue
			}
			errs = append(errs, f.Errorf(field("type"), "nic %q: %v", n.Name, err))
		}
	}
	return f.Join(errs...)
}

// FieldError is a NIC check's failure of one of its fields.
type FieldError struct {
	Field string
	Err   error
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// CheckNIC checks what one NIC refers to (its bridge, OVS bridge or CNI
// network) and whether vhost can be had; a *FieldError names the field.
func (m *Manager) CheckNIC(ctx context.Context, n spec.NIC, vhost bool) error {
	return m.checkNIC(ctx, "", n, vhost)
}

// checkNIC is CheckNIC for a NIC of vm ("": a NIC not yet the VM's).
func (m *Manager) checkNIC(ctx context.Context, vm string, n spec.NIC, vhost bool) error {
	if n.Vhost == spec.VhostOn && !vhost {
		return &FieldError{"vhost", fmt.Errorf("vhost \"on\" needs %s, which this host does not have", vhostNetDev)}
	}
	switch n.Type {
	case spec.NICBridge:
		if _, err := netsetup.CheckBridge(n.Bridge); err != nil {
			return &FieldError{"bridge", err}
		}
	case spec.NICOVS:
		if err := m.ovs(m.OVSDB).CheckBridge(ctx, n.Bridge); err != nil {
			return &FieldError{"bridge", err}
		}
	case spec.NICCNI:
		cni := netsetup.CNI{BinDirs: m.CNIBinDirs}
		if _, err := cni.Load(ctx, n.CNIConfig); err != nil {
			return &FieldError{"cni_config", err}
		}
	case spec.NICNetwork:
		if m.Networks == nil {
			return &FieldError{"network", errors.New("managed networks are not available here")}
		}
		if field, err := m.Networks.CheckNIC(vm, n); err != nil {
			return &FieldError{field, err}
		}
	}
	return nil
}

// NICUp makes the host side of one tap NIC and records it in st (and
// net.json) before making it. bus is the root port of a hot-plugged NIC.
func (m *Manager) NICUp(ctx context.Context, vm string, n spec.NIC, bus string, owner Owner, st *Record) error {
	p := m.Store.Paths(vm)
	ns := NICRecord{Name: n.Name, Type: n.Type, Tap: n.Tap, Bridge: n.Bridge, Bus: bus,
		Network: n.Network, AllowSpoofing: n.AllowSpoofing, SecurityGroups: n.SecurityGroups}
	if n.Type == spec.NICOVS {
		ns.OVSDB = m.OVSDB
	}
	if n.Type == spec.NICCNI {
		if st.Netns == nil {
			return fmt.Errorf("nic %q: the VM has no network namespace (cni NICs need one made at start)", n.Name)
		}
		ns.CNI = &netsetup.CNIAttachment{Config: n.CNIConfig, ContainerID: "vmsup-" + vm, IfName: netsetup.CNIIfName(n.Name)}
	}
	st.NICs = append(st.NICs, ns)
	idx := len(st.NICs) - 1
	if err := WriteRecord(p, st); err != nil {
		return err
	}
	mac, _ := net.ParseMAC(n.MAC)
	// The tap belongs to the user QEMU runs as, so the unprivileged QEMU
	// can open it by name.
	tap := netsetup.Tap{Name: n.Tap, Owner: owner.UID, Group: owner.GID, MTU: n.MTU, GuestMAC: mac, Queues: n.Queues}
	err := func() error {
		switch n.Type {
		case spec.NICBridge, spec.NICOVS:
			return m.plugSwitchTap(ctx, vm, n.Name, tap, n.Type, n.Bridge, ns.OVSDB)
		case spec.NICCNI:
			a := *ns.CNI
			a.Netns = st.Netns.Host
			cni := netsetup.CNI{BinDirs: st.CNIBinDirs, CacheDir: st.CNICache}
			res, err := cni.Add(ctx, a)
			if err != nil {
				return err
			}
			st.NICs[idx].Result = &res
			if err := WriteRecord(p, st); err != nil {
				return err
			}
			return netsetup.WireTap(a.Netns, tap, a.IfName)
		case spec.NICNetwork:
			return m.managedUp(ctx, vm, n, tap, st)
		}
		return fmt.Errorf("type %q has no tap", n.Type)
	}()
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
		defer cancel()
		if derr := m.nicDown(uctx, st, st.NICs[idx], false); derr != nil {
			m.Logger.Warn("undo NIC", "vm", vm, "nic", n.Name, "err", derr)
		}
		st.NICs = st.NICs[:idx]
		WriteRecord(p, st)
		return err // the step's name names the NIC
	}
	return nil
}

// createTap makes the tap, replacing a stale one of the same name (the
// name is derived from the VM and NIC, so a leftover is this VM's own).
func (m *Manager) createTap(vm string, t netsetup.Tap) error {
	err := netsetup.CreateTap(t)
	if errors.Is(err, netsetup.ErrExists) {
		if !netsetup.IsTap(t.Name) {
			return fmt.Errorf("tap %s: a link of that name exists and is not a tap; not touching it", t.Name)
		}
		m.Logger.Warn("removing a stale tap", "vm", vm, "tap", t.Name)
		if err := netsetup.DeleteTap(t.Name); err != nil {
			return err
		}
		err = netsetup.CreateTap(t)
	}
	return err
}

// nicDown removes one NIC's host side. inUnit: running as the unit's
// ExecStopPost= hook, which sees namespaces at their unit paths.
func (m *Manager) nicDown(ctx context.Context, st *Record, n NICRecord, inUnit bool) error {
	switch n.Type {
	case spec.NICBridge, spec.NICOVS:
		// Both taps of a local migration, if one was under way.
		return errors.Join(m.tapDown(ctx, n, n.Next), m.tapDown(ctx, n, n.Tap))
	case spec.NICNetwork:
		return m.managedDown(ctx, n)
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

// Teardown removes what the VM's network record names, newest first, then
// the namespace and the record; idempotent. inUnit: running as the unit's
// ExecStopPost= hook, which sees namespaces at their unit paths.
func (m *Manager) Teardown(ctx context.Context, name string, inUnit bool) error {
	p := m.Store.Paths(name)
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := os.Stat(p.Records); err != nil {
		return nil
	}
	lk, ok, err := vmstore.LockFile(lctx, p.NetLock(), true)
	if err != nil {
		return fmt.Errorf("network lock: %w", err)
	}
	if !ok {
		return fmt.Errorf("network lock: not free within 30s")
	}
	defer lk.Unlock()
	st, err := ReadRecord(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for i := len(st.NICs) - 1; i >= 0; i-- {
		if err := m.nicDown(ctx, st, st.NICs[i], inUnit); err != nil {
			errs = append(errs, fmt.Errorf("nic %q: %w", st.NICs[i].Name, err))
		}
	}
	if st.Netns != nil {
		var err error
		if inUnit {
			err = netsetup.DeleteNetnsPath(st.Netns.Unit)
		} else {
			err = m.netnsMaker().Delete(ctx, st.NetnsName)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	os.RemoveAll(p.CNICache())
	if err := os.Remove(p.NetState()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
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
	// Network NICs: the managed network, the filter and what it dropped.
	Network        string            `json:"network,omitempty"`
	AntiSpoofing   bool              `json:"anti_spoofing,omitempty"`
	SecurityGroups []string          `json:"security_groups,omitempty"`
	Dropped        *nicfilter.Counts `json:"dropped,omitempty"`
}

// Statuses reports the host side of the VM's tap NICs from net.json,
// checked against the kernel, OVS and CNI CHECK.
func (m *Manager) Statuses(ctx context.Context, name string) []NICStatus {
	st, err := ReadRecord(m.Store.Paths(name))
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
		case spec.NICNetwork:
			m.managedStatus(n, &ns)
		case spec.NICOVS:
			ns.TapUp = netsetup.LinkExists(n.Tap)
			ns.Bridge, _ = m.ovs(n.OVSDB).PortBridge(ctx, n.Tap)
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

// NewRecord is the empty network record of a VM about to start.
func (m *Manager) NewRecord(vm string) *Record {
	return &Record{VM: vm, CNIBinDirs: m.CNIBinDirs, CNICache: m.Store.Paths(vm).CNICache()}
}

// MakeNetns makes the VM's network namespace (for its CNI NICs), recorded
// in st before it is made; a stale one of the same name is replaced.
func (m *Manager) MakeNetns(ctx context.Context, vm string, st *Record) error {
	p := m.Store.Paths(vm)
	name := netnsName(vm)
	nm := m.netnsMaker()
	st.NetnsName = name
	paths := nm.Paths(name)
	st.Netns = &paths
	if err := WriteRecord(p, st); err != nil {
		return err
	}
	got, err := nm.Create(ctx, name)
	if errors.Is(err, netsetup.ErrExists) {
		m.Logger.Info("removing a stale network namespace", "vm", vm, "netns", name)
		if err := nm.Delete(ctx, name); err != nil {
			return err
		}
		got, err = nm.Create(ctx, name)
	}
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", name, err)
	}
	*st.Netns = got
	return WriteRecord(p, st)
}

// HasRecord reports whether the VM has a network record (something made).
func (m *Manager) HasRecord(vm string) bool {
	_, err := os.Stat(m.Store.Paths(vm).NetState())
	return err == nil
}

// Forget removes a hot-plugged NIC's host side and its record entry.
func (m *Manager) Forget(ctx context.Context, vm, nic string) error {
	p := m.Store.Paths(vm)
	st, err := ReadRecord(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	j := slices.IndexFunc(st.NICs, func(n NICRecord) bool { return n.Name == nic })
	if j < 0 {
		return nil
	}
	if err := m.nicDown(ctx, st, st.NICs[j], false); err != nil {
		return fmt.Errorf("nic %q: %w", nic, err)
	}
	st.NICs = slices.Delete(st.NICs, j, j+1)
	return WriteRecord(p, st)
}

// UnitDevices are the device nodes the VM's unit needs for tap NICs.
func (m *Manager) UnitDevices() []units.DeviceRule {
	d := []units.DeviceRule{{Path: "/dev/net/tun", Access: "rw"}}
	if m.Vhost() {
		d = append(d, units.DeviceRule{Path: vhostNetDev, Access: "rw"})
	}
	return d
}

// Tap is where one of the VM's tap NICs lives on the host: its name and
// the network namespace it is in ("" the host's).
type Tap struct {
	NIC, Tap, Netns string
}

// Taps lists the VM's tap NICs from net.json (none for user networking).
func (m *Manager) Taps(name string) []Tap {
	st, err := ReadRecord(m.Store.Paths(name))
	if err != nil {
		return nil
	}
	var out []Tap
	for _, n := range st.NICs {
		t := Tap{NIC: n.Name, Tap: n.Tap}
		if n.Type == spec.NICCNI && st.Netns != nil {
			t.Netns = st.Netns.Host
		}
		if t.Tap != "" {
			out = append(out, t)
		}
	}
	return out
}

// plugSwitchTap makes tap and plugs it into a Linux bridge (its MTU the
// bridge's unless the NIC sets one) or an OVS bridge: a NIC's first tap at
// start and its second for migrate --local alike.
func (m *Manager) plugSwitchTap(ctx context.Context, vm, nic string, tap netsetup.Tap, typ, bridge, ovsdb string) error {
	if typ == spec.NICBridge && tap.MTU == 0 {
		mtu, err := netsetup.CheckBridge(bridge)
		if err != nil {
			return err
		}
		tap.MTU = mtu
	}
	if err := m.createTap(vm, tap); err != nil {
		return err
	}
	if typ == spec.NICBridge {
		return netsetup.AttachBridge(tap.Name, bridge)
	}
	removed, err := m.ovs(ovsdb).AddPort(ctx, bridge, tap.Name, vm)
	if len(removed) > 0 {
		m.Logger.Warn("removed stale OVS ports", "vm", vm, "nic", nic, "ports", removed)
	}
	return err
}
