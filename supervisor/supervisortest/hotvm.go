package supervisortest

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// The memory sizes HotVM is set between: its file's, and one DIMM more.
const (
	BigMem   = 384 * spec.MiB
	SmallMem = 256 * spec.MiB
)

// HotVM is a running guest for the hot-plug commands: a counter on its
// console, a tap NIC on a bridge, room for a disk (Disk), a NIC (NIC) and
// a DIMM. Its checks tell whether a command left anything half-made.
type HotVM struct {
	Sup    *supervisor.Supervisor
	VM     string
	File   *spec.File
	Disk   *spec.Disk // "fd", a qcow2 image made by each attach
	NIC    spec.NIC   // "fn", on Bridge
	Bridge string
}

// NewHotVM makes the Linux bridge (in the test's network namespace) and a
// VM file for e's guest, whose disk's image goes under root's images, and
// brings the VM up on sup; the VM and the bridge go when the test ends.
func NewHotVM(t *testing.T, ctx context.Context, e *testenv.Env, sup *supervisor.Supervisor, root, vm, bridge string) *HotVM {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(br) })
	netlink.LinkSetUp(br)
	dir := t.TempDir()
	path := filepath.Join(dir, vm+".toml")
	WriteGuestTOML(t, e, path, vm, `max_memory = "512M"
stop_timeout = "5s"
[[nic]]
name = "boot"
type = "bridge"
bridge = "`+bridge+`"`)
	b, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(b), `cmdline = "console=ttyS0 no_timer_check"`, `cmdline = "console=ttyS0 no_timer_check vmsup.counter memhp_default_state=online_movable"`, 1)), 0o644)
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h := &HotVM{Sup: sup, VM: vm, File: f, Bridge: bridge, NIC: spec.NIC{Name: "fn", Type: spec.NICBridge, Bridge: bridge}}
	if h.Disk, err = spec.CheckDisk("fault", spec.Disk{Name: "fd", File: filepath.Join(root, "images", "fd.qcow2"), Size: 16 * spec.MiB}, vm); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), vm) })
	st, _ := sup.Status(ctx, vm)
	testenv.WaitLog(t, st.ConsoleLog, "VMSUP-COUNTER", 90*time.Second)
	return h
}

// Status is the VM's status; an error fails the test.
func (h *HotVM) Status(t *testing.T, ctx context.Context) supervisor.Status {
	t.Helper()
	st, err := h.Sup.Status(ctx, h.VM)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// HasDisk reports whether st records the disk attached.
func (h *HotVM) HasDisk(st supervisor.Status) bool { return slices.Contains(st.AttachedDisks, "fd") }

// HasNIC reports whether st records the NIC attached, with its host side.
func (h *HotVM) HasNIC(st supervisor.Status) bool {
	return slices.ContainsFunc(st.NICs, func(n supervisor.NICInfo) bool { return n.Name == "fn" && n.Tap != "" }) // its host side recorded
}

// Attach attaches the disk.
func (h *HotVM) Attach(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := h.Sup.AttachDisk(ctx, h.VM, *h.Disk); err != nil {
		t.Fatalf("attach: %v", err)
	}
}

// Detach detaches the disk and removes its image.
func (h *HotVM) Detach(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := h.Sup.DetachDisk(ctx, h.VM, "fd"); err != nil {
		t.Fatalf("detach: %v", err)
	}
	os.Remove(h.Disk.File) // each attach makes the image anew
}

// NICAttach attaches the NIC.
func (h *HotVM) NICAttach(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := h.Sup.AttachNIC(ctx, h.VM, h.NIC); err != nil {
		t.Fatalf("nic attach: %v", err)
	}
}

// NICDetach detaches the NIC.
func (h *HotVM) NICDetach(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := h.Sup.DetachNIC(ctx, h.VM, "fn"); err != nil {
		t.Fatalf("nic detach: %v", err)
	}
}

// SetMem resizes the VM's memory to m.
func (h *HotVM) SetMem(t *testing.T, ctx context.Context, m spec.Size) {
	t.Helper()
	if _, err := h.Sup.Resize(ctx, h.VM, supervisor.ResizeOptions{Memory: m}); err != nil {
		t.Fatalf("set memory %s: %v", m, err)
	}
}

// WaitAgent waits until the guest agent answers: the guest's init started
// acpid before it, so a power button press is seen from then on.
func (h *HotVM) WaitAgent(t *testing.T, ctx context.Context) {
	t.Helper()
	w := testenv.StartGuestWait("the guest agent answers", 90*time.Second)
	for ; ; time.Sleep(200 * time.Millisecond) {
		if a, err := h.Sup.GuestPing(ctx, h.VM); err == nil && a.Responding {
			w.Done()
			return
		}
		if w.Expired() {
			t.Fatalf("vm %s: the guest agent did not answer: %s", h.VM, w.Explain())
		}
	}
}

// The checks take the side the guest runs on (unused: a HotVM is on one)
// so that they fit the fault suite's per-command check.

// CheckDisk checks that QEMU has the disk's parts exactly when the record
// says the disk is attached, and that its image is granted to QEMU's user
// only then.
func (h *HotVM) CheckDisk(t *testing.T, ctx context.Context, _ *Side, st supervisor.Status) {
	t.Helper()
	in := h.HasDisk(st)
	have := qemuHas(t, ctx, h.Sup, h.VM)
	for _, id := range diskParts(t, *h.Disk) {
		if have[id] != in {
			t.Fatalf("disk fd recorded %v, but QEMU has %s: %v", in, id, have[id])
		}
	}
	// Granted while attached by a hot-plug; a restart boots it as a
	// descriptor (internal/lifecycle/diskfds), granted nothing. Never granted when
	// not attached.
	if acl := namedACL(t, h.Disk.File); len(acl) > 0 && !in {
		t.Fatalf("disk fd recorded %v, but its image's grants are %v", in, acl)
	}
}

// CheckNIC checks that QEMU has the NIC's device and backend, and the host
// its tap, exactly when the record says it is attached.
func (h *HotVM) CheckNIC(t *testing.T, ctx context.Context, _ *Side, st supervisor.Status) {
	t.Helper()
	in := h.HasNIC(st)
	if have := qemuHas(t, ctx, h.Sup, h.VM); have[qemuargs.NICDeviceID("fn")] != in || have[qemuargs.NetdevID("fn")] != in {
		t.Fatalf("nic fn recorded %v, but QEMU has device %v, netdev %v", in, have[qemuargs.NICDeviceID("fn")], have[qemuargs.NetdevID("fn")])
	}
	var want []string
	for _, n := range st.NICs {
		if n.Tap != "" { // a host side is recorded
			want = append(want, n.Tap)
		}
	}
	slices.Sort(want)
	if got := taps(t); !slices.Equal(got, want) {
		t.Fatalf("taps on the host %v, recorded %v", got, want)
	}
}

// CheckMem checks that status says the memory QEMU has, and that no DIMM
// backend is left without its DIMM.
func (h *HotVM) CheckMem(t *testing.T, ctx context.Context, _ *Side, st supervisor.Status) {
	t.Helper()
	var sum struct {
		Return struct {
			Base    int64 `json:"base-memory"`
			Plugged int64 `json:"plugged-memory"`
		} `json:"return"`
	}
	rawQMP(t, ctx, h.Sup, h.VM, `{"execute":"query-memory-size-summary"}`, &sum)
	if got := spec.Size(sum.Return.Base + sum.Return.Plugged); got.String() != st.Memory {
		t.Fatalf("status says memory %s, QEMU has %s", st.Memory, got)
	}
	have := qemuHas(t, ctx, h.Sup, h.VM)
	for id := range have {
		if strings.HasPrefix(id, "mem-dimm") && !have[strings.TrimPrefix(id, "mem-")] {
			t.Fatalf("a memory backend %s without its DIMM", id)
		}
	}
}

// CheckAll is every check at once.
func (h *HotVM) CheckAll(t *testing.T, ctx context.Context, on *Side, st supervisor.Status) {
	h.CheckDisk(t, ctx, on, st)
	h.CheckNIC(t, ctx, on, st)
	h.CheckMem(t, ctx, on, st)
}
