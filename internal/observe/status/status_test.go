package status

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/internal/lifecycle/confine"
	"github.com/vmsup/vmsup/internal/lifecycle/guestagent"
	vmnet "github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// stand-in is a Host without a VM: systemd's units, the VMs' views and
// their monitors are what a case says.
type standIn struct {
	store    vmstore.Store
	units    map[string]units.Status // by unit name; missing: not loaded
	views    map[string]*vmstore.View
	qemu     map[string]*monitor // missing: the monitor cannot be opened
	settled  string
	settle   error
	nics     []vmnet.NICStatus
	ended    string
	runsFile bool
	ping     guestagent.AgentStatus
}

type monitor struct {
	status qmp.StatusInfo
	err    error
	pinged bool
}

func (m *monitor) QueryStatus(context.Context) (qmp.StatusInfo, error) { return m.status, m.err }
func (m *monitor) PingAgent(context.Context) (guestagent.AgentStatus, error) {
	m.pinged = true
	return guestagent.AgentStatus{Responding: true, Version: "on the session"}, nil
}

var errNoMonitor = errors.New("QMP: connection refused")

func (h *standIn) State() vmstore.Store { return h.store }
func (h *standIn) View(name string) (*vmstore.View, error) {
	if v := h.views[name]; v != nil {
		return v, nil
	}
	return nil, vmstore.ErrNoRecord
}
func (h *standIn) Systemd(context.Context) (Systemd, error) { return h, nil }
func (h *standIn) Status(_ context.Context, unit string) (units.Status, error) {
	st := h.units[unit]
	st.Name = unit
	return st, nil
}
func (h *standIn) List(context.Context, ...string) ([]units.Status, error) {
	var out []units.Status
	for n, st := range h.units {
		st.Name = n
		out = append(out, st)
	}
	return out, nil
}
func (h *standIn) Settle(context.Context, string) (string, error) { return h.settled, h.settle }
func (h *standIn) Monitor(_ context.Context, name string) (Monitor, func(), error) {
	if m := h.qemu[name]; m != nil {
		return m, func() {}, nil
	}
	return nil, nil, errNoMonitor
}
func (h *standIn) GuestPing(context.Context, string) (guestagent.AgentStatus, error) {
	return h.ping, nil
}
func (h *standIn) Enabled(name string) bool                       { return name == "web" }
func (h *standIn) NICs(context.Context, string) []vmnet.NICStatus { return h.nics }
func (h *standIn) EndedReason(string) string                      { return h.ended }
func (h *standIn) RunsFile(*vmstore.Applied, *spec.VM) bool       { return h.runsFile }
func (h *standIn) NotFound(name string) error                     { return vmerr.Wrap(name, vmstore.ErrNotFound) }
func (h *standIn) Confinement(context.Context, string, string, uint32, bool) *confine.Status {
	return &confine.Status{User: "vmsup-web"}
}

// newStandIn is a state root with the VMs named having a state directory.
func newStandIn(t *testing.T, dirs ...string) *standIn {
	h := &standIn{store: vmstore.Store{Root: t.TempDir()}, units: map[string]units.Status{},
		views: map[string]*vmstore.View{}, qemu: map[string]*monitor{}}
	for _, n := range dirs {
		if err := os.MkdirAll(h.store.Paths(n).Dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// viewOf is a recorded VM started from file (may be "").
func viewOf(name, file string) *vmstore.View {
	vm := &spec.VM{Name: name, CPUs: 2, Memory: 512 * spec.MiB, Description: "the web"}
	live := *vm
	live.CPUs = 4
	return &vmstore.View{Name: name, Owner: file, Booted: vm, Spec: &live, Tree: &snapshottree.Tree{},
		Applied: &vmstore.Applied{Name: name, SourceFile: file, Generation: 3, UUID: "u-1"}}
}

func active(since time.Time) units.Status {
	return units.Status{Exists: true, ActiveState: "active", SubState: "running", MainPID: 42, Since: since}
}

func TestStatus(t *testing.T) {
	long := time.Now().Add(-time.Hour)
	file := filepath.Join(t.TempDir(), "web.toml")
	if err := os.WriteFile(file, []byte("name = \"web\"\nmemory = \"512M\"\n[[disk]]\nname = \"root\"\nfile = \"root.qcow2\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const unit = "vmsup-web.service"
	type want struct {
		state                  State
		reason, qemu, unitSt   string
		sync                   string
		pending                []string
		cpus                   int
		agent, confined, found bool
	}
	for _, c := range []struct {
		name   string
		dir    bool
		unit   units.Status
		view   *vmstore.View
		qemu   *monitor
		runs   bool
		detail bool
		want   want
	}{
		{name: "unknown", want: want{found: false}},
		{name: "shut off", dir: true, view: viewOf("web", ""),
			want: want{state: StateShutOff, reason: "QEMU crashed at then", cpus: 2, found: true}},
		{name: "crashed", dir: true, unit: units.Status{Exists: true, ActiveState: "failed", SubState: "failed", ExecMainCode: 2, ExecMainStatus: 9},
			want: want{state: StateCrashed, reason: "killed by signal KILL", unitSt: "failed/failed", found: true}},
		{name: "unit starting", dir: true, unit: units.Status{Exists: true, ActiveState: "activating", SubState: "start"},
			want: want{state: StateStarting, unitSt: "activating/start", found: true}},
		{name: "unit stopping", dir: true, unit: units.Status{Exists: true, ActiveState: "deactivating", SubState: "stop-sigterm"},
			want: want{state: StateStopping, unitSt: "deactivating/stop-sigterm", found: true}},
		{name: "monitor not open yet", dir: true, unit: active(time.Now()),
			want: want{state: StateStarting, unitSt: "active/running", confined: true, found: true}},
		{name: "monitor gone", dir: true, unit: active(long),
			want: want{state: StateUnknown, reason: errNoMonitor.Error(), unitSt: "active/running", confined: true, found: true}},
		{name: "QEMU does not answer", dir: true, unit: active(long), qemu: &monitor{err: errors.New("EOF")},
			want: want{state: StateUnknown, reason: "EOF", unitSt: "active/running", confined: true, found: true}},
		{name: "running in sync", dir: true, unit: active(long), view: viewOf("web", file), runs: true, detail: true,
			qemu: &monitor{status: qmp.StatusInfo{Status: "running", Running: true}},
			want: want{state: StateRunning, qemu: "running", unitSt: "active/running", sync: SyncInSync, cpus: 4,
				agent: true, confined: true, found: true}},
		{name: "running, no ping without detail", dir: true, unit: active(long), view: viewOf("web", ""),
			qemu: &monitor{status: qmp.StatusInfo{Status: "running", Running: true}},
			want: want{state: StateRunning, qemu: "running", unitSt: "active/running", cpus: 4, confined: true, found: true}},
		{name: "paused, file changed", dir: true, unit: active(long), view: withPending(viewOf("web", file)),
			qemu: &monitor{status: qmp.StatusInfo{Status: "paused"}},
			want: want{state: StatePaused, qemu: "paused", unitSt: "active/running", sync: SyncChanged,
				pending: []string{"~ memory 512M -> 1G"}, cpus: 4, confined: true, found: true}},
		{name: "in sync: nothing pending", dir: true, unit: active(long), view: withPending(viewOf("web", file)), runs: true,
			qemu: &monitor{status: qmp.StatusInfo{Status: "paused"}},
			want: want{state: StatePaused, qemu: "paused", unitSt: "active/running", sync: SyncInSync, cpus: 4, confined: true, found: true}},
		{name: "file unreadable", dir: true, unit: active(long), view: viewOf("web", file+".gone"),
			qemu: &monitor{status: qmp.StatusInfo{Status: "guest-panicked"}},
			want: want{state: StatePanicked, qemu: "guest-panicked", unitSt: "active/running", sync: SyncNoFile, cpus: 4, confined: true, found: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newStandIn(t)
			if c.dir {
				h = newStandIn(t, "web")
			}
			h.ended, h.runsFile = "QEMU crashed at then", c.runs
			if c.unit.Exists {
				h.units[unit] = c.unit
			}
			if c.view != nil {
				h.views["web"] = c.view
			}
			if c.qemu != nil {
				h.qemu["web"] = c.qemu
			}
			st, err := New(h, Options{StartGrace: 10 * time.Second}).Status(context.Background(), "web", c.detail)
			if !c.want.found {
				if !errors.Is(err, vmstore.ErrNotFound) {
					t.Fatalf("Status = %v, want not found", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := want{state: st.State, reason: st.Reason, qemu: st.QEMUStatus, unitSt: st.UnitState, sync: st.Sync,
				pending: st.Pending, cpus: st.CPUs, agent: st.GuestAgent != nil, confined: st.Confinement != nil, found: true}
			if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			if st.Unit != unit || !st.Autostart || st.StateDir != h.store.Paths("web").Dir {
				t.Errorf("unit %q, autostart %v, state dir %q", st.Unit, st.Autostart, st.StateDir)
			}
			if c.view != nil && (st.Generation != 0) != (c.want.qemu != "") {
				t.Errorf("generation %d with QEMU status %q: only a QEMU that answers says it", st.Generation, st.QEMUStatus)
			}
		})
	}
}

func withPending(v *vmstore.View) *vmstore.View {
	v.Pending = &vmstore.Pending{Changes: []string{"~ memory 512M -> 1G"}}
	return v
}

// TestStatusRecorded: the disks, NICs, host devices and snapshots come from
// the running view, NICs with their host side where the network has one.
func TestStatusRecorded(t *testing.T) {
	h := newStandIn(t, "web")
	v := viewOf("web", "")
	v.Booted.HostDevs = []spec.HostDev{{Address: "0000:01:00.0", Name: "gpu"}}
	v.Applied.AttachedHostDevs = []vmstore.AttachedHostDev{{Dev: spec.HostDev{Address: "0000:02:00.0", Name: "nvme"}}}
	v.Disks = []vmstore.Disk{
		{Disk: spec.Disk{Name: "root", Type: spec.DiskFile, File: "/new/root.qcow2", Format: "qcow2"}, MovedFrom: "/old/root.qcow2",
			Active: snapshottree.Image{Path: "/new/root.s1.qcow2"}},
		{Disk: spec.Disk{Name: "cd", Type: "iso", File: "/x.iso", Format: "raw"}},
		{Disk: spec.Disk{Name: "data", Type: spec.DiskFile, File: "/d.raw", Format: "raw"}, Attached: true},
	}
	v.NICs = []vmstore.NIC{
		{NIC: spec.NIC{Name: "net0", Type: "user", MAC: "52:54:00:00:00:01", Forwards: []string{"tcp::2222-:22"}}},
		{NIC: spec.NIC{Name: "br0", Type: "bridge", MAC: "52:54:00:00:00:02", Link: spec.LinkDown}},
		{NIC: spec.NIC{Name: "hot", Type: "bridge", MAC: "52:54:00:00:00:03"}, Attached: true},
	}
	v.Tree = &snapshottree.Tree{Snapshots: []snapshottree.Snapshot{{Tag: "s0"}, {Tag: "s1"}}, Current: "s1"}
	h.views["web"] = v
	h.nics = []vmnet.NICStatus{{Name: "br0", Type: "bridge", Tap: "tap-web-br0", Bridge: "br0", TapUp: true}}
	st, err := New(h, Options{}).Status(context.Background(), "web", false)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != StateShutOff || st.CPUs != 2 || st.Memory != "512M" || st.Description != "the web" || st.UUID != "u-1" {
		t.Errorf("state %s, cpus %d, memory %s, description %q, uuid %q: want the booted spec's", st.State, st.CPUs, st.Memory, st.Description, st.UUID)
	}
	wantDisks := []DiskInfo{
		{Name: "root", Type: spec.DiskFile, Source: "/new/root.qcow2", Format: "qcow2", Image: "/new/root.s1.qcow2"},
		{Name: "cd", Type: "iso", Source: "/x.iso", Format: "raw", ReadOnly: true},
		{Name: "data", Type: spec.DiskFile, Source: "/d.raw", Format: "raw", Hotplugged: true},
	}
	wantNICs := []NICInfo{
		{NICStatus: vmnet.NICStatus{Name: "net0", Type: "user"}, Link: spec.LinkUp, MAC: "52:54:00:00:00:01", Forwards: []string{"tcp::2222-:22"}},
		{NICStatus: h.nics[0], Link: spec.LinkDown, MAC: "52:54:00:00:00:02", Forwards: []string{}},
		{NICStatus: vmnet.NICStatus{Name: "hot", Type: "bridge", Hotplug: true}, Link: spec.LinkUp, MAC: "52:54:00:00:00:03", Forwards: []string{}},
	}
	for _, d := range []struct {
		what      string
		want, got any
	}{
		{"disks", wantDisks, st.Disks},
		{"nics", wantNICs, st.NICs},
		{"moved", []string{"root: /old/root.qcow2 -> /new/root.qcow2"}, st.MovedDisks},
		{"attached", []string{"data"}, st.AttachedDisks},
		{"host devices", []HostDevInfo{{Address: "0000:01:00.0", Name: "gpu"}, {Address: "0000:02:00.0", Name: "nvme", Attached: true}}, st.HostDevs},
		{"snapshots", []string{"s0", "s1"}, st.Snapshots},
		{"current snapshot", "s1", st.CurrentSnapshot},
	} {
		if diff := cmp.Diff(d.want, d.got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", d.what, diff)
		}
	}

	// Without a record: no devices at all (JSON null), not empty lists.
	delete(h.views, "web")
	st, err = New(h, Options{}).Status(context.Background(), "web", false)
	if err != nil || st.Disks != nil || st.NICs != nil || st.CPUs != 0 {
		t.Errorf("without a record: %v, disks %v, nics %v, cpus %d", err, st.Disks, st.NICs, st.CPUs)
	}
}

// TestStatusRecovery: what settling did, or why it could not, is said.
func TestStatusRecovery(t *testing.T) {
	h := newStandIn(t, "web")
	h.settled = "finished the disk move"
	r := New(h, Options{})
	if st, err := r.Status(context.Background(), "web", false); err != nil || st.Recovery != h.settled {
		t.Errorf("Recovery = %q, %v; want %q", st.Recovery, err, h.settled)
	}
	h.settle = errors.New("busy")
	if st, err := r.Status(context.Background(), "web", false); err != nil || st.Recovery != "busy" {
		t.Errorf("Recovery = %q, %v; want the error", st.Recovery, err)
	}
	if _, err := r.Status(context.Background(), "../x", false); err == nil {
		t.Error("an invalid name passed")
	}
}

// TestList: the VMs with a state directory and those with a VM's unit
// only, sorted; a running one's agent is asked, and shown only when it
// answers. vmsup's other units (vmsup-api.service) are not VMs, and a
// reserved name is refused without reading its unit.
func TestList(t *testing.T) {
	h := newStandIn(t, "web", "db")
	h.units["vmsup-web.service"] = active(time.Now().Add(-time.Hour))
	h.units["vmsup-web@migrated.service"] = active(time.Now()) // not a name of its own
	h.units["vmsup-orphan.service"] = units.Status{Exists: true, ActiveState: "failed", SubState: "failed", Description: "vmsup VM orphan"}
	h.units["vmsup-api.service"] = active(time.Now())
	h.units["vmsup-other.service"] = units.Status{Exists: true, ActiveState: "failed", Description: "someone else's"}
	if _, err := New(h, Options{}).Status(context.Background(), "api", false); !errors.Is(err, vmstore.ErrNotFound) || !strings.Contains(err.Error(), "remote API server") {
		t.Errorf("status api: %v; want not found, naming the API server", err)
	}
	h.qemu["web"] = &monitor{status: qmp.StatusInfo{Status: "running", Running: true}}
	for _, c := range []struct {
		ping  guestagent.AgentStatus
		agent bool
	}{{guestagent.AgentStatus{Responding: true, Version: "9"}, true}, {guestagent.AgentStatus{Error: "no channel"}, false}} {
		h.ping = c.ping
		got, err := New(h, Options{}).List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, st := range got {
			names = append(names, st.Name+" "+string(st.State))
		}
		if diff := cmp.Diff([]string{"db shut off", "orphan crashed", "web running"}, names); diff != "" {
			t.Errorf("List (-want +got):\n%s", diff)
		}
		if web := got[2]; (web.GuestAgent != nil) != c.agent || h.qemu["web"].pinged {
			t.Errorf("agent %+v (want shown: %v); pinged on the session: %v", web.GuestAgent, c.agent, h.qemu["web"].pinged)
		}
	}
}

func TestQEMUState(t *testing.T) {
	for _, c := range []struct {
		qs     qmp.StatusInfo
		state  State
		reason string
	}{
		{qmp.StatusInfo{Status: "running", Running: true}, StateRunning, ""},
		{qmp.StatusInfo{Status: "paused"}, StatePaused, ""},
		{qmp.StatusInfo{Status: "suspended"}, StatePaused, ""},
		{qmp.StatusInfo{Status: "guest-panicked"}, StatePanicked, ""},
		{qmp.StatusInfo{Status: "shutdown"}, StateUnknown, "QEMU status shutdown"},
		{qmp.StatusInfo{Status: "io-error"}, StateUnknown, "QEMU status io-error"},
		{qmp.StatusInfo{Status: "inmigrate"}, "inmigrate", ""},
		{qmp.StatusInfo{Status: "finish-migrate"}, "finish migrate", ""},
	} {
		if st, reason := QEMUState(c.qs); st != c.state || reason != c.reason {
			t.Errorf("QEMUState(%q) = %q, %q; want %q, %q", c.qs.Status, st, reason, c.state, c.reason)
		}
	}
}

// IPv4: the agent's addresses, then the host's for the NICs (a managed
// network's lease, a CNI result) the agent did not report; none but the
// host's when the agent did not answer; IPv6 left out.
func TestIPv4(t *testing.T) {
	agent := &guestagent.AgentStatus{Responding: true, Addresses: []guestagent.GuestAddress{
		{Interface: "eth0", Address: "10.77.0.50/24"}, {Interface: "eth0", Address: "fd00::5/64"}}}
	nics := []NICInfo{
		{NICStatus: vmnet.NICStatus{Name: "lan", Addrs: []string{"10.77.0.50"}}},
		{NICStatus: vmnet.NICStatus{Name: "pod", Addrs: []string{"10.22.0.7/16", "fd01::7/64"}}},
		{NICStatus: vmnet.NICStatus{Name: "user"}},
	}
	for _, tc := range []struct {
		name string
		st   Status
		want []string
	}{
		{"agent and host", Status{GuestAgent: agent, NICs: nics}, []string{"10.77.0.50/24 (eth0)", "10.22.0.7/16 (nic pod)"}},
		{"no agent", Status{NICs: nics}, []string{"10.77.0.50 (nic lan)", "10.22.0.7/16 (nic pod)"}},
		{"nothing known", Status{NICs: nics[2:]}, nil},
	} {
		if diff := cmp.Diff(tc.want, tc.st.IPv4()); diff != "" {
			t.Errorf("%s: IPv4 (-want +got):\n%s", tc.name, diff)
		}
	}
}

// IPv6: the global addresses (not link-local) of the agent and then of the
// host's NICs, as IPv4 lists the IPv4 ones.
func TestIPv6(t *testing.T) {
	agent := &guestagent.AgentStatus{Responding: true, Addresses: []guestagent.GuestAddress{
		{Interface: "eth0", Address: "10.77.0.50/24"}, {Interface: "eth0", Address: "fe80::5054:ff:fe00:1/64"},
		{Interface: "eth0", Address: "fd00::5054:ff:fe00:1/64"}}}
	nics := []NICInfo{{NICStatus: vmnet.NICStatus{Name: "lan", Addrs: []string{"10.77.0.50", "fd00::5054:ff:fe00:1"}}},
		{NICStatus: vmnet.NICStatus{Name: "pod", Addrs: []string{"fd01::7/64"}}}}
	got := Status{GuestAgent: agent, NICs: nics}.IPv6()
	if diff := cmp.Diff([]string{"fd00::5054:ff:fe00:1/64 (eth0)", "fd01::7/64 (nic pod)"}, got); diff != "" {
		t.Errorf("IPv6 (-want +got):\n%s", diff)
	}
	if got := (Status{NICs: nics[:1]}).IPv6(); len(got) != 1 || got[0] != "fd00::5054:ff:fe00:1 (nic lan)" {
		t.Errorf("IPv6 without an agent: %q", got)
	}
}
