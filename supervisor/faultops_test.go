package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// faultBridge is the Linux bridge the fault suite's NICs plug into, in the
// package's private network namespace (TestMain).
const faultBridge = "vmsfltbr0"

// hotVM is a running guest for the hot-plug commands: a counter on its
// console, a tap NIC on bridge, room for a disk, a NIC and a DIMM.
type hotVM struct {
	sup    *supervisor.Supervisor
	vm     string
	f      *spec.File
	disk   *spec.Disk
	nic    spec.NIC
	bridge string
}

func newHotVM(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, root, vm, bridge string) *hotVM {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.LinkDel(br) })
	netlink.LinkSetUp(br)
	dir := t.TempDir()
	path := filepath.Join(dir, vm+".toml")
	writeGuestTOML(t, path, vm, `max_memory = "512M"
stop_timeout = "5s"
[[nic]]
name = "boot"
type = "bridge"
bridge = "`+bridge+`"`)
	b, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(b), `cmdline = "console=ttyS0"`, `cmdline = "console=ttyS0 vmsup.counter memhp_default_state=online_movable"`, 1)), 0o644)
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h := &hotVM{sup: sup, vm: vm, f: f, bridge: bridge, nic: spec.NIC{Name: "fn", Type: spec.NICBridge, Bridge: bridge}}
	if h.disk, err = spec.CheckDisk("fault", spec.Disk{Name: "fd", File: filepath.Join(root, "images", "fd.qcow2"), Size: 16 * spec.MiB}, vm); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), vm) })
	st, _ := sup.Status(ctx, vm)
	waitConsole(t, st, "VMSUP-COUNTER", 90*time.Second)
	return h
}

func (h *hotVM) status(t *testing.T, ctx context.Context) supervisor.Status {
	t.Helper()
	st, err := h.sup.Status(ctx, h.vm)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (h *hotVM) hasDisk(st supervisor.Status) bool { return slices.Contains(st.AttachedDisks, "fd") }
func (h *hotVM) hasNIC(st supervisor.Status) bool {
	return slices.ContainsFunc(st.NICs, func(n supervisor.NICInfo) bool { return n.Name == "fn" && n.Tap != "" }) // its host side recorded
}

func (h *hotVM) attach(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := h.sup.AttachDisk(ctx, h.vm, *h.disk); err != nil {
		t.Fatalf("attach: %v", err)
	}
}

func (h *hotVM) detach(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := h.sup.DetachDisk(ctx, h.vm, "fd"); err != nil {
		t.Fatalf("detach: %v", err)
	}
	os.Remove(h.disk.File) // each attach makes the image anew
}

func (h *hotVM) nicAttach(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := h.sup.AttachNIC(ctx, h.vm, h.nic); err != nil {
		t.Fatalf("nic attach: %v", err)
	}
}

func (h *hotVM) nicDetach(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := h.sup.DetachNIC(ctx, h.vm, "fn"); err != nil {
		t.Fatalf("nic detach: %v", err)
	}
}

func (h *hotVM) setMem(t *testing.T, ctx context.Context, m spec.Size) {
	t.Helper()
	if _, err := h.sup.Resize(ctx, h.vm, supervisor.ResizeOptions{Memory: m}); err != nil {
		t.Fatalf("set memory %s: %v", m, err)
	}
}

// checkDisk: QEMU has the disk's parts and its image is granted to QEMU's
// user exactly when the record says the disk is attached.
func (h *hotVM) checkDisk(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
	t.Helper()
	in := h.hasDisk(st)
	have := qemuHas(t, ctx, h.sup, h.vm)
	for _, id := range diskParts(t, *h.disk) {
		if have[id] != in {
			t.Fatalf("disk fd recorded %v, but QEMU has %s: %v", in, id, have[id])
		}
	}
	if acl := namedACL(t, h.disk.File); (len(acl) > 0) != in {
		t.Fatalf("disk fd recorded %v, but its image's grants are %v", in, acl)
	}
}

// checkNIC: QEMU has the NIC's device and backend, and the host its tap,
// exactly when the record says it is attached.
func (h *hotVM) checkNIC(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
	t.Helper()
	in := h.hasNIC(st)
	if have := qemuHas(t, ctx, h.sup, h.vm); have[qemuargs.NICDeviceID("fn")] != in || have[qemuargs.NetdevID("fn")] != in {
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

// checkMem: status says the memory QEMU has, and no DIMM backend is
// left without its DIMM.
func (h *hotVM) checkMem(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
	t.Helper()
	var sum struct {
		Return struct {
			Base    int64 `json:"base-memory"`
			Plugged int64 `json:"plugged-memory"`
		} `json:"return"`
	}
	rawQMP(t, ctx, h.sup, h.vm, `{"execute":"query-memory-size-summary"}`, &sum)
	if got := spec.Size(sum.Return.Base + sum.Return.Plugged); got.String() != st.Memory {
		t.Fatalf("status says memory %s, QEMU has %s", st.Memory, got)
	}
	have := qemuHas(t, ctx, h.sup, h.vm)
	for id := range have {
		if strings.HasPrefix(id, "mem-dimm") && !have[strings.TrimPrefix(id, "mem-")] {
			t.Fatalf("a memory backend %s without its DIMM", id)
		}
	}
}

// checkAll is every check at once.
func (h *hotVM) checkAll(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
	h.checkDisk(t, ctx, on, st)
	h.checkNIC(t, ctx, on, st)
	h.checkMem(t, ctx, on, st)
}

const (
	bigMem   = 384 * spec.MiB
	smallMem = 256 * spec.MiB
)

// TestFaultsHotplug: disk attach and detach, NIC attach and detach, set and
// restart, each killed after every step and at random times.
func TestFaultsHotplug(t *testing.T) {
	ctx := ctxT(t, 25*time.Minute)
	root := t.TempDir()
	a := sideOf(t, "A", env.Systemd, root, filepath.Join(root, "etc-systemd"), nil)
	const vm = "fhot"
	h := newHotVM(t, ctx, a.sup, root, vm, faultBridge)
	job := func(op string, edit func(*faultJob)) func(*faultSide) faultJob {
		return func(on *faultSide) faultJob {
			j := on.job
			j.Op, j.VM = op, vm
			edit(&j)
			return j
		}
	}
	var counts []string
	run := func(op faultOp) {
		t.Run(op.name, func(t *testing.T) {
			op.vm, op.sides = vm, []*faultSide{a}
			if op.random == 0 {
				op.random = 10
			}
			n := runFaults(t, ctx, op)
			counts = append(counts, fmt.Sprintf("%s %d+%d", op.name, n.stepKills, n.randomKills+n.randomMissed))
		})
	}
	run(faultOp{name: "disk-attach", job: job("disk-attach", func(j *faultJob) { j.Disk = h.disk }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.hasDisk(h.status(t, ctx)) {
				h.detach(t, ctx)
			}
		},
		check: h.checkDisk,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if !h.hasDisk(st) {
				h.attach(t, ctx) // repeat
			}
			h.detach(t, ctx) // and back
		}})
	run(faultOp{name: "disk-detach", job: job("disk-detach", func(j *faultJob) { j.Disk = h.disk }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if !h.hasDisk(h.status(t, ctx)) {
				h.attach(t, ctx)
			}
		},
		check: h.checkDisk,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if h.hasDisk(st) {
				h.detach(t, ctx) // repeat
			} else {
				os.Remove(h.disk.File)
			}
		}})
	run(faultOp{name: "nic-attach", job: job("nic-attach", func(j *faultJob) { j.NIC = &h.nic }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.hasNIC(h.status(t, ctx)) {
				h.nicDetach(t, ctx)
			}
		},
		check: h.checkNIC,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if !h.hasNIC(st) {
				h.nicAttach(t, ctx)
			}
			h.nicDetach(t, ctx)
		}})
	run(faultOp{name: "nic-detach", job: job("nic-detach", func(j *faultJob) { j.NIC = &h.nic }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if !h.hasNIC(h.status(t, ctx)) {
				h.nicAttach(t, ctx)
			}
		},
		check: h.checkNIC,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if h.hasNIC(st) {
				h.nicDetach(t, ctx)
			}
		}})
	run(faultOp{name: "set", job: job("set", func(j *faultJob) { j.Memory = bigMem }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if h.status(t, ctx).Memory != smallMem.String() {
				h.setMem(t, ctx, smallMem)
			}
		},
		check: h.checkMem,
		again: func(t *testing.T, ctx context.Context, _ *faultSide, st supervisor.Status) {
			if st.Memory != bigMem.String() {
				h.setMem(t, ctx, bigMem) // repeat
			}
			h.setMem(t, ctx, smallMem) // and back
		}})
	run(faultOp{name: "restart", job: job("restart", func(j *faultJob) { j.File = h.f.Path }),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) {},
		check:  h.checkAll,
		again: func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
			// (the next settle sees its guest's counter move)
			if _, err := h.sup.Restart(ctx, h.f); err != nil {
				t.Fatalf("restart again: %v", err)
			}
		}})
	// An ACPI reboot tells QEMU to pause, not exit, on the guest's
	// poweroff: killed anywhere, it must be finished (by its guardian) and
	// QEMU's poweroff action given back. (Its random kills also found that
	// TCG's translation buffer, 1 GiB by default, outgrew the unit's
	// MemoryMax after a few reboots: qemuargs bounds it now.)
	run(faultOp{name: "reboot", job: job("reboot", func(*faultJob) {}),
		before: func(t *testing.T, ctx context.Context, _ *faultSide) { h.waitAgent(t, ctx) },
		check: func(t *testing.T, ctx context.Context, on *faultSide, st supervisor.Status) {
			if st.QEMUStatus != "running" {
				t.Fatalf("QEMU %s after an interrupted reboot", st.QEMUStatus)
			}
			h.checkAll(t, ctx, on, st)
		}})
	// ... so a guest poweroff now ends QEMU (a left "pause" action would
	// keep it, and down would have to quit it).
	h.waitAgent(t, ctx)
	if r, err := h.sup.Down(ctx, h.vm); err != nil || r.Step != supervisor.StoppedACPI {
		t.Fatalf("down after the reboot faults: %s, %v (want the guest's own ACPI poweroff)", r.Step, err)
	}
	t.Logf("FAULTS hotplug (step kills + random kills): %s", strings.Join(counts, ", "))
}

// waitAgent waits until the guest agent answers: the guest's init started
// acpid before it, so a power button press is seen from then on.
func (h *hotVM) waitAgent(t *testing.T, ctx context.Context) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if a, err := h.sup.GuestPing(ctx, h.vm); err == nil && a.Responding {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest agent did not answer")
		}
	}
}

// diskParts are the ids of what QEMU has of a plugged disk.
func diskParts(t *testing.T, d spec.Disk) []string {
	p, err := qemuargs.Disk(d, qemuargs.DiskHost{Image: "/dev/null", SecretFile: "/dev/null"}, "rp1")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, x := range p.Devices {
		ids = append(ids, x.ID)
	}
	for _, x := range p.Blockdevs {
		ids = append(ids, x.NodeName)
	}
	for _, x := range p.Objects {
		ids = append(ids, x.ID)
	}
	return ids
}

// rawQMP runs one QMP command on the VM and decodes the reply into out.
func rawQMP(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm, cmd string, out any) {
	t.Helper()
	b, err := sup.QMP(ctx, vm, []byte(cmd), false)
	if err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, b)
	}
}

// qemuHas is every id QEMU knows: devices, block nodes, objects, netdevs.
func qemuHas(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string) map[string]bool {
	t.Helper()
	have := map[string]bool{}
	for _, path := range []string{"/machine/peripheral", "/objects"} {
		var r struct {
			Return []struct{ Name string } `json:"return"`
		}
		rawQMP(t, ctx, sup, vm, fmt.Sprintf(`{"execute":"qom-list","arguments":{"path":%q}}`, path), &r)
		for _, x := range r.Return {
			have[x.Name] = true
		}
	}
	var nodes struct {
		Return []struct {
			NodeName string `json:"node-name"`
		} `json:"return"`
	}
	rawQMP(t, ctx, sup, vm, `{"execute":"query-named-block-nodes","arguments":{"flat":true}}`, &nodes)
	for _, n := range nodes.Return {
		have[n.NodeName] = true
	}
	// Netdevs have no QMP query in QEMU 7.2 but "info network".
	var hmp struct {
		Return string `json:"return"`
	}
	rawQMP(t, ctx, sup, vm, `{"execute":"human-monitor-command","arguments":{"command-line":"info network"}}`, &hmp)
	for _, l := range strings.Split(hmp.Return, "\n") {
		l = strings.TrimLeft(l, " \\_")
		if id, _, ok := strings.Cut(l, ":"); ok && strings.HasPrefix(id, "net-") {
			have[id] = true
		}
	}
	return have
}

// namedACL lists the named-user entries on path's ACL (none if it is gone).
func namedACL(t *testing.T, path string) []string {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	out, err := exec.Command("getfacl", "--omit-header", "--absolute-names", "--numeric", path).Output()
	if err != nil {
		t.Fatalf("getfacl %s: %v", path, err)
	}
	var named []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Split(l, ":"); len(f) == 3 && f[0] == "user" && f[1] != "" {
			named = append(named, l)
		}
	}
	return named
}

// taps lists the tap devices in this network namespace.
func taps(t *testing.T) []string {
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Type() == "tuntap" {
			out = append(out, l.Attrs().Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestFaultsMigrate: migrate --local, then across two hosts (each way),
// killed after every step of the source's side and at random times.
func TestFaultsMigrate(t *testing.T) {
	ctx := ctxT(t, 25*time.Minute)
	ha, hb := twoHosts(t)
	dir := t.TempDir()
	const vm = "fmig"
	f := migGuest(t, dir, vm, "256M", filepath.Join(dir, "shared-data.raw"))
	if _, err := ha.sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ha.sup.Down(context.Background(), vm)
		hb.sup.Down(context.Background(), vm)
	})
	st, _ := ha.sup.Status(ctx, vm)
	waitConsole(t, st, "VMSUP-COUNTER", 90*time.Second)
	a := sideOf(t, "A", ha.sd, ha.root, ha.unitDir(), ha.sup)
	b := sideOf(t, "B", hb.sd, hb.root, hb.unitDir(), hb.sup)
	host := map[*faultSide]*migHost{a: ha, b: hb}
	var counts []string
	none := func(*testing.T, context.Context, *faultSide) {}
	t.Run("local", func(t *testing.T) {
		n := runFaults(t, ctx, faultOp{name: "migrate-local", vm: vm, sides: []*faultSide{a}, random: 10, markers: dir, before: none,
			job: func(on *faultSide) faultJob {
				j := on.job
				j.Op, j.VM = "migrate-local", vm
				return j
			},
			again: func(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
				if _, err := on.sup.Migrate(ctx, vm, supervisor.MigrateOptions{Local: true}); err != nil {
					t.Fatalf("the next migration: %v", err)
				}
			}})
		counts = append(counts, fmt.Sprintf("local %d+%d", n.stepKills, n.randomKills+n.randomMissed))
	})
	if t.Failed() {
		return
	}
	other := func(on *faultSide) *faultSide {
		if on == a {
			return b
		}
		return a
	}
	opts := func(from *faultSide) supervisor.MigrateOptions {
		to := host[other(from)]
		return supervisor.MigrateOptions{To: to.name, Address: to.addr, Transport: to.transport(""), Dial: host[from].dial}
	}
	t.Run("cross-host", func(t *testing.T) {
		n := runFaults(t, ctx, faultOp{name: "migrate", vm: vm, sides: []*faultSide{a, b}, random: 10, markers: dir, before: none,
			job: func(on *faultSide) faultJob {
				o := opts(on)
				j := on.job
				j.Op, j.VM, j.To, j.Address, j.Transport, j.DialNetns = "migrate", vm, o.To, o.Address, o.Transport, host[on].netns
				return j
			},
			again: func(t *testing.T, ctx context.Context, on *faultSide, _ supervisor.Status) {
				if _, err := on.sup.Migrate(ctx, vm, opts(on)); err != nil {
					t.Fatalf("the next migration (%s -> %s): %v", on.name, other(on).name, err)
				}
			}})
		counts = append(counts, fmt.Sprintf("cross-host %d+%d", n.stepKills, n.randomKills+n.randomMissed))
	})
	if t.Failed() {
		return
	}
	t.Run("receiver-killed", func(t *testing.T) {
		// The destination's receiver dies mid-stream (SIGKILL): the source
		// runs on, and the destination's guardian tears its QEMU down.
		op := faultOp{name: "receiver-killed", vm: vm, sides: []*faultSide{a, b}, markers: dir}
		for i := range 5 {
			on := settle(t, ctx, op, nil)
			to := other(on)
			pidf := filepath.Join(t.TempDir(), "pid")
			o := opts(on)
			o.Transport = host[to].transport("", "sh", "-c", `echo $$ >`+pidf+`; exec "$@"`, "sh")
			o.Bandwidth = 8 << 20 // a stream long enough to be cut
			delay := time.Duration(200+150*i) * time.Millisecond
			sup := host[on].withHook(t, afterPrepared(delay, func() {
				b, _ := os.ReadFile(pidf)
				var pid int
				fmt.Sscan(string(b), &pid)
				if pid > 0 {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}))
			_, err := sup.Migrate(ctx, vm, o)
			t.Logf("receiver on %s killed %s after prepare: %v", to.name, delay, err)
			after := settle(t, ctx, op, nil)
			if err != nil && after != on {
				t.Fatalf("the migration failed but the guest runs on %s", after.name)
			}
		}
		counts = append(counts, "receiver-killed 5")
	})
	t.Logf("FAULTS migrate (step kills + random kills): %s", strings.Join(counts, ", "))
}
