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
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	vmnet "github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/snapshottree"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// standIn is status's systemd and QEMU without either: systemd's units, the
// VMs' monitors and their agents are what a case says. Everything else is
// a real Env on a state root of its own (newStandIn), its records written
// as the commands write them.
type standIn struct {
	env   *machine.Env
	units map[string]units.Status // by unit name; missing: not loaded
	qemu  map[string]*monitor     // missing: the monitor cannot be opened
	ping  guestagent.AgentStatus
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
func (h *standIn) Monitor(_ context.Context, name string) (Monitor, func(), error) {
	if m := h.qemu[name]; m != nil {
		return m, func() {}, nil
	}
	return nil, nil, errNoMonitor
}
func (h *standIn) GuestPing(context.Context, string) (guestagent.AgentStatus, error) {
	return h.ping, nil
}
func (h *standIn) Confinement(context.Context, string, string, uint32, bool) *confine.Status {
	return &confine.Status{User: "vmsup-web"}
}

// reader is status over the real Env with this systemd and QEMU.
func (h *standIn) reader(o Options) *Reader {
	r := New(h.env, o)
	r.sys = h
	return r
}

// newStandIn is a real Env on a state root of its own, the VMs named having
// a state directory; web is enabled at boot.
func newStandIn(t *testing.T, dirs ...string) *standIn {
	t.Helper()
	env, err := machine.New(machine.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close() })
	h := &standIn{env: env, units: map[string]units.Status{}, qemu: map[string]*monitor{}}
	for _, n := range dirs {
		p := env.State().Paths(n)
		if err := os.MkdirAll(p.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := p.MakeRecords(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.State().Mark("web", "/etc/vmsup/web.toml"); err != nil {
		t.Fatal(err)
	}
	return h
}

// recordWeb records web as started from file ("" for none), generation 3,
// booted with 2 vCPUs and at 4 since a live resize: with the file's spec
// when inSync, else with one the file has changed from since; pending: an
// apply left a change of memory for the next start.
func recordWeb(t *testing.T, h *standIn, file string, inSync, pending bool) {
	t.Helper()
	vm := &spec.VM{Name: "web", CPUs: 4, Memory: 512 * spec.MiB, Description: "the web"}
	if inSync {
		f, err := spec.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		vm = &f.VM
	}
	booted := *vm
	booted.CPUs = 2
	app := &vmstore.Applied{Name: "web", SourceFile: file, Generation: 3, UUID: "u-1",
		Resized: &vmstore.Resized{CPUs: 4, Memory: vm.Memory}}
	app.SetVM(&booted)
	writeApplied(t, h, app)
	if pending {
		if err := h.env.State().WritePending("web", &vmstore.Pending{Changes: []string{"~ memory 512M -> 1G"}}); err != nil {
			t.Fatal(err)
		}
	}
}

func writeApplied(t *testing.T, h *standIn, app *vmstore.Applied) {
	t.Helper()
	if err := h.env.State().WriteApplied(app, nil); err != nil {
		t.Fatal(err)
	}
}

// crashedAt writes web's history: its QEMU crashed at then.
func crashedAt(t *testing.T, h *standIn, then time.Time) {
	t.Helper()
	r := eventlog.Record{Time: then, VM: "web", Source: eventlog.SourceVmsup, Event: eventlog.Crashed}
	if err := eventlog.Append(h.env.State().Paths("web").EventHistory(), r); err != nil {
		t.Fatal(err)
	}
}

func active(since time.Time) units.Status {
	return units.Status{Exists: true, ActiveState: "active", SubState: "running", MainPID: 42, Since: since}
}

func TestStatus(t *testing.T) {
	long := time.Now().Add(-time.Hour)
	then := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	file := filepath.Join(t.TempDir(), "web.toml")
	if err := os.WriteFile(file, []byte("name = \"web\"\ncpus = 4\nmemory = \"512M\"\n[[disk]]\nname = \"root\"\nfile = \"root.qcow2\"\n"), 0o644); err != nil {
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
		name     string
		dir      bool
		unit     units.Status
		recorded bool   // web has a record, started from file from
		from     string // ("" for none)
		runs     bool   // what runs is from's spec
		pending  bool   // an apply left a change pending
		qemu     *monitor
		detail   bool
		want     want
	}{
		{name: "unknown", want: want{found: false}},
		{name: "shut off", dir: true, recorded: true,
			want: want{state: StateShutOff, reason: "QEMU crashed at " + then.Local().Format(time.RFC3339), cpus: 2, found: true}},
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
		{name: "running in sync", dir: true, unit: active(long), recorded: true, from: file, runs: true, detail: true,
			qemu: &monitor{status: qmp.StatusInfo{Status: "running", Running: true}},
			want: want{state: StateRunning, qemu: "running", unitSt: "active/running", sync: SyncInSync, cpus: 4,
				agent: true, confined: true, found: true}},
		{name: "running, no ping without detail", dir: true, unit: active(long), recorded: true,
			qemu: &monitor{status: qmp.StatusInfo{Status: "running", Running: true}},
			want: want{state: StateRunning, qemu: "running", unitSt: "active/running", cpus: 4, confined: true, found: true}},
		{name: "paused, file changed", dir: true, unit: active(long), recorded: true, from: file, pending: true,
			qemu: &monitor{status: qmp.StatusInfo{Status: "paused"}},
			want: want{state: StatePaused, qemu: "paused", unitSt: "active/running", sync: SyncChanged,
				pending: []string{"~ memory 512M -> 1G"}, cpus: 4, confined: true, found: true}},
		{name: "in sync: nothing pending", dir: true, unit: active(long), recorded: true, from: file, runs: true, pending: true,
			qemu: &monitor{status: qmp.StatusInfo{Status: "paused"}},
			want: want{state: StatePaused, qemu: "paused", unitSt: "active/running", sync: SyncInSync, cpus: 4, confined: true, found: true}},
		{name: "file unreadable", dir: true, unit: active(long), recorded: true, from: file + ".gone",
			qemu: &monitor{status: qmp.StatusInfo{Status: "guest-panicked"}},
			want: want{state: StatePanicked, qemu: "guest-panicked", unitSt: "active/running", sync: SyncNoFile, cpus: 4, confined: true, found: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newStandIn(t)
			if c.dir {
				h = newStandIn(t, "web")
				crashedAt(t, h, then)
			}
			if c.unit.Exists {
				h.units[unit] = c.unit
			}
			if c.recorded {
				recordWeb(t, h, c.from, c.runs, c.pending)
			}
			if c.qemu != nil {
				h.qemu["web"] = c.qemu
			}
			st, err := h.reader(Options{StartGrace: 10 * time.Second}).Status(context.Background(), "web", c.detail)
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
			if st.Unit != unit || !st.Autostart || st.StateDir != h.env.State().Paths("web").Dir {
				t.Errorf("unit %q, autostart %v, state dir %q", st.Unit, st.Autostart, st.StateDir)
			}
			if c.recorded && (st.Generation != 0) != (c.want.qemu != "") {
				t.Errorf("generation %d with QEMU status %q: only a QEMU that answers says it", st.Generation, st.QEMUStatus)
			}
		})
	}
}

// TestStatusRecorded: the disks, NICs, host devices and snapshots come from
// the running view (the VM's records), NICs with their host side where the
// network recorded one.
func TestStatusRecorded(t *testing.T) {
	h := newStandIn(t, "web")
	p := h.env.State().Paths("web")
	vm := &spec.VM{Name: "web", CPUs: 2, Memory: 512 * spec.MiB, Description: "the web",
		HostDevs: []spec.HostDev{{Address: "0000:01:00.0", Name: "gpu"}},
		Disks: []spec.Disk{
			{Name: "root", Type: spec.DiskFile, File: "/old/root.qcow2", Format: "qcow2"},
			{Name: "cd", Type: "iso", File: "/x.iso", Format: "raw"},
		},
		NICs: []spec.NIC{
			{Name: "net0", Type: "user", MAC: "52:54:00:00:00:01", Forwards: []string{"tcp::2222-:22"}},
			{Name: "br0", Type: "bridge", Bridge: "br0", MAC: "52:54:00:00:00:02", Link: spec.LinkDown},
		}}
	app := &vmstore.Applied{Name: "web", Generation: 3, UUID: "u-1",
		Moved: map[string]vmstore.MovedDisk{"root": {From: "/old/root.qcow2",
			Disk: spec.Disk{Name: "root", Type: spec.DiskFile, File: "/new/root.qcow2", Format: "qcow2"}}},
		Attached:         []vmstore.AttachedDisk{{Disk: spec.Disk{Name: "data", Type: spec.DiskFile, File: "/d.raw", Format: "raw"}, Bus: "rp1"}},
		AttachedNICs:     []spec.NIC{{Name: "hot", Type: "bridge", Bridge: "br0", MAC: "52:54:00:00:00:03"}},
		AttachedHostDevs: []vmstore.AttachedHostDev{{Dev: spec.HostDev{Address: "0000:02:00.0", Name: "nvme"}}}}
	app.SetVM(vm)
	writeApplied(t, h, app)
	tree := &snapshottree.Tree{Snapshots: []snapshottree.Snapshot{{Tag: "s0"}, {Tag: "s1"}}, Current: "s1",
		Active: map[string]snapshottree.Image{"root": {Path: "/new/root.s1.qcow2", Format: "qcow2"}}}
	if err := tree.Save(p.Snapshots()); err != nil {
		t.Fatal(err)
	}
	// The network's record of br0: a tap that is not there (not up, on no bridge).
	tap := vmnet.NICRecord{Name: "br0", Type: "bridge", Tap: "vmsup-no-tap0"}
	if err := vmnet.WriteRecord(p, &vmnet.Record{VM: "web", NICs: []vmnet.NICRecord{tap}}); err != nil {
		t.Fatal(err)
	}
	st, err := h.reader(Options{}).Status(context.Background(), "web", false)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != StateShutOff || st.CPUs != 2 || st.Memory != "512M" || st.Description != "the web" || st.UUID != "u-1" {
		t.Errorf("state %s, cpus %d, memory %s, description %q, uuid %q: want the booted spec's", st.State, st.CPUs, st.Memory, st.Description, st.UUID)
	}
	wantDisks := []DiskInfo{
		{Name: "root", Type: spec.DiskFile, Source: "/new/root.qcow2", Format: "qcow2", Image: "/new/root.s1.qcow2"},
		{Name: "cd", Type: "iso", Source: "/x.iso", Format: "raw", ReadOnly: true},
		{Name: "data", Type: spec.DiskFile, Source: "/d.raw", Format: "raw", Hotplugged: true, Image: "/d.raw"},
	}
	wantNICs := []NICInfo{
		{NICStatus: vmnet.NICStatus{Name: "net0", Type: "user"}, Link: spec.LinkUp, MAC: "52:54:00:00:00:01", Forwards: []string{"tcp::2222-:22"}},
		{NICStatus: vmnet.NICStatus{Name: "br0", Type: "bridge", Tap: "vmsup-no-tap0"}, Link: spec.LinkDown, MAC: "52:54:00:00:00:02", Forwards: []string{}},
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
	if err := os.Remove(p.State); err != nil {
		t.Fatal(err)
	}
	st, err = h.reader(Options{}).Status(context.Background(), "web", false)
	if err != nil || st.Disks != nil || st.NICs != nil || st.CPUs != 0 {
		t.Errorf("without a record: %v, disks %v, nics %v, cpus %d", err, st.Disks, st.NICs, st.CPUs)
	}
}

// TestStatusRecovery: what settling an operation a killed command left did,
// or why it could not, is said; an operation whose command is at work (it
// holds the VM's lock) is left alone.
func TestStatusRecovery(t *testing.T) {
	h := newStandIn(t, "web")
	ctx := context.Background()
	k := h.env.Ops()
	k.Register("test-move", func(context.Context, string, *operation.Op) (string, error) { return "finished the disk move", nil })
	k.Register("test-stuck", func(context.Context, string, *operation.Op) (string, error) {
		return "", errors.New("QEMU does not answer")
	})
	r := h.reader(Options{})
	lk, _, err := k.Lock(ctx, "web", "test-move")
	if err != nil {
		t.Fatal(err)
	}
	o, err := k.Begin(ctx, "web", "test-move", nil)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := r.Status(ctx, "web", false); err != nil || st.Recovery != "" {
		t.Errorf("while its command works: Recovery = %q, %v; want none", st.Recovery, err)
	}
	o.Close() // its command dies here
	lk.Unlock()
	if st, err := r.Status(ctx, "web", false); err != nil || st.Recovery != "recovered an interrupted test-move: finished the disk move" {
		t.Errorf("Recovery = %q, %v; want the recoverer's note", st.Recovery, err)
	}
	o, err = k.Begin(ctx, "web", "test-stuck", nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	if st, err := r.Status(ctx, "web", false); err != nil || !strings.Contains(st.Recovery, "could not be recovered: QEMU does not answer") {
		t.Errorf("Recovery = %q, %v; want why it could not", st.Recovery, err)
	}
	if p, _ := k.Pending("web"); p == nil {
		t.Error("the journal of a failed recovery is gone")
	} else {
		p.Close()
	}
	if _, err := r.Status(ctx, "../x", false); err == nil {
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
	if _, err := h.reader(Options{}).Status(context.Background(), "api", false); !errors.Is(err, vmstore.ErrNotFound) || !strings.Contains(err.Error(), "remote API server") {
		t.Errorf("status api: %v; want not found, naming the API server", err)
	}
	h.qemu["web"] = &monitor{status: qmp.StatusInfo{Status: "running", Running: true}}
	for _, c := range []struct {
		ping  guestagent.AgentStatus
		agent bool
	}{{guestagent.AgentStatus{Responding: true, Version: "9"}, true}, {guestagent.AgentStatus{Error: "no channel"}, false}} {
		h.ping = c.ping
		got, err := h.reader(Options{}).List(context.Background())
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
