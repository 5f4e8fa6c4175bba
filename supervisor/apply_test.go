package supervisor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// applyCfg is one version of TestApply's file.
type applyCfg struct {
	desc           string
	memory         string
	cpus, maxCPUs  int
	cmdline        string // appended to the kernel command line
	cpuQuota       int
	iops           int
	cd             string
	extraDisk      bool
	outside        string // a disk image outside the image directories
	wan            bool
	lanDown        bool
	health, within string
	balloonTarget  string
}

func (c applyCfg) write(t *testing.T, path, images string) *spec.File {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `name = "apply"
description = %q
memory = %q
max_memory = "512M"
cpus = %d
max_cpus = %d
accel = "tcg"
hotplug_slots = 3
stop_timeout = "10s"
balloon = true
balloon_target = %q
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.online memhp_default_state=online_movable%s"
[limits]
cpu_quota = %d
[health]
console = %q
timeout = %q
[[disk]]
name = "data"
file = %q
size = "32M"
serial = "data"
iops = %d
[[disk]]
name = "cd"
type = "iso"
file = %q
`, c.desc, c.memory, c.cpus, c.maxCPUs, c.balloonTarget, env.Guest.Kernel, env.Guest.Initrd, c.cmdline, c.cpuQuota, c.health, c.within,
		filepath.Join(images, "data.qcow2"), c.iops, filepath.Join(images, c.cd))
	if c.extraDisk {
		fmt.Fprintf(&b, "[[disk]]\nname = \"extra\"\nfile = %q\nsize = \"16M\"\nserial = \"extra\"\n", filepath.Join(images, "extra.qcow2"))
	}
	if c.outside != "" {
		fmt.Fprintf(&b, "[[disk]]\nname = \"outside\"\nfile = %q\nsize = \"8M\"\nserial = \"outside\"\n", c.outside)
	}
	link := "up"
	if c.lanDown {
		link = "down"
	}
	fmt.Fprintf(&b, "[[nic]]\nname = \"lan\"\nlink = %q\n", link)
	if c.wan {
		b.WriteString("[[nic]]\nname = \"wan\"\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := spec.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestApply: plan and apply on a real guest, each class in turn. Live: a
// disk and a NIC in and out, vCPUs and memory up, I/O limits (the guest's
// dd rate follows them), the link down and up, the CD-ROM's medium, the
// unit's CPU quota, the description; at the next reboot: a kernel command
// line the guest reads after rebooting by itself; restart: max_cpus, with
// the health gate, and a failing gate that brings the previous spec back.
// After each, plan is empty (or says what is left) and the guest sees it;
// a second apply does nothing; and apply killed after each of its steps
// leaves a truthful plan and converges at the next apply.
func TestApply(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, cd := range []string{"a", "b"} { // raw "discs": a marker in the first sector
		data := append([]byte("VMSUP-CD-"+strings.ToUpper(cd)), make([]byte, 64<<10)...)
		if err := os.WriteFile(filepath.Join(images, cd+".iso"), data[:64<<10], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "apply.toml")
	v1 := applyCfg{desc: "v1", memory: "256M", cpus: 1, maxCPUs: 2, cd: "a.iso", health: testenv.ShellMarker, within: "2m", balloonTarget: "0"}
	f := v1.write(t, path, images)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Kill(context.Background(), "apply") })
	st, _ := sup.Status(ctx, "apply")
	g := bootGuest(t, ctx, st)
	g.run(`for i in /sys/class/net/eth*; do ip link set ${i##*/} up; done`)
	expectPlan(t, ctx, sup, f)
	if st.Sync != supervisor.SyncInSync || st.Generation != 1 {
		t.Errorf("status after up: sync %q, generation %d", st.Sync, st.Generation)
	}
	dd := func(g *guest) time.Duration { // 40 direct 4 KiB reads of the data disk, timed in the guest
		out := g.run(`D=$(for b in /sys/block/vd*; do [ "$(cat $b/serial)" = data ] && echo /dev/${b##*/}; done); a=$(cut -d' ' -f1 /proc/uptime); dd if=$D of=/dev/null bs=4096 count=40 iflag=direct 2>/dev/null; b=$(cut -d' ' -f1 /proc/uptime); echo $a $b`)
		var a, b float64
		fmt.Sscan(out, &a, &b)
		return time.Duration((b - a) * float64(time.Second))
	}
	cdMarker := func(g *guest, want string) {
		out := g.run(fmt.Sprintf(`for i in $(seq 50); do m=$(dd if=/dev/sr0 bs=2048 count=1 iflag=direct 2>/dev/null | head -c 10); [ "$m" = %s ] && break; sleep 0.2; done; echo $m`, want))
		if out != want {
			t.Errorf("CD-ROM reads %q, want %q", out, want)
		}
	}
	cdMarker(g, "VMSUP-CD-A")

	t.Run("impossible", func(t *testing.T) {
		// A change that cannot be applied refuses the whole file: the
		// description, which could, stays as it was.
		bad := v1.write(t, path, images)
		raw := strings.Replace(string(bad.Raw), `serial = "data"`, "serial = \"data\"\nformat = \"raw\"", 1)
		raw = strings.Replace(raw, `description = "v1"`, `description = "never"`, 1)
		os.WriteFile(path, []byte(raw), 0o644)
		fb, err := spec.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sup.Apply(ctx, fb, supervisor.ApplyOptions{})
		if err == nil || !strings.Contains(err.Error(), "nothing was changed: disk[data].format: the image") {
			t.Fatalf("apply of an impossible change: %v", err)
		}
		if st, _ := sup.Status(ctx, "apply"); st.Description != "v1" {
			t.Errorf("description %q after a refused apply", st.Description)
		}
	})

	t.Run("live", func(t *testing.T) {
		g := g.in(t)
		v2 := v1
		v2.desc, v2.memory, v2.cpus, v2.cpuQuota, v2.iops, v2.cd = "v2", "384M", 2, 50, 10, "b.iso"
		v2.extraDisk, v2.wan, v2.lanDown = true, true, true
		f2 := v2.write(t, path, images)
		p, err := sup.Plan(ctx, f2)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range p.Changes {
			if c.Class != plan.Live {
				t.Errorf("not live: %s", c)
			}
		}
		if len(p.Changes) != 9 {
			t.Fatalf("plan: %d changes, want 9:\n%s", len(p.Changes), planLines(p.Changes))
		}
		memBefore := memKB(g)
		res, err := sup.Apply(ctx, f2, supervisor.ApplyOptions{})
		if err != nil || len(res.Applied) != 9 || len(res.Pending) != 0 {
			t.Fatalf("apply: %+v, %v", res, err)
		}
		expectPlan(t, ctx, sup, f2)
		g.devOf("extra")
		macs := g.run(fmt.Sprintf(`for i in $(seq 50); do grep -qi %s /sys/class/net/*/address && break; sleep 0.2; done; cat /sys/class/net/*/address`, f2.VM.NICs[1].MAC))
		if !strings.Contains(strings.ToLower(macs), strings.ToLower(f2.VM.NICs[1].MAC)) {
			t.Errorf("the guest has no NIC with wan's MAC %s: %s", f2.VM.NICs[1].MAC, macs)
		}
		if got := carrier(g, f2.VM.NICs[0].MAC); got != "0" {
			t.Errorf("lan carrier %q after link = down", got)
		}
		if got := g.run(`for i in $(seq 100); do [ "$(cat /sys/devices/system/cpu/online)" = 0-1 ] && break; sleep 0.2; done; cat /sys/devices/system/cpu/online`); got != "0-1" {
			t.Errorf("cpus online %q, want 0-1", got)
		}
		if got := memKB(g); got-memBefore < 120<<10 {
			t.Errorf("MemTotal %d -> %d kB: the 128M DIMM is not online", memBefore, got)
		}
		cdMarker(g, "VMSUP-CD-B")
		slow := dd(g)
		if slow < 2500*time.Millisecond {
			t.Errorf("40 reads at iops = 10 took %s", slow)
		}
		st, _ := sup.Status(ctx, "apply")
		if st.Description != "v2" || st.Sync != supervisor.SyncInSync || st.Generation < 2 {
			t.Errorf("status: description %q, sync %q, generation %d", st.Description, st.Sync, st.Generation)
		}
		if q := unitProp(t, ctx, "apply", "CPUQuotaPerSecUSec"); q != "500ms" {
			t.Errorf("CPUQuotaPerSecUSec %q, want 500ms", q)
		}
		// Apply twice: nothing to do.
		again, err := sup.Apply(ctx, f2, supervisor.ApplyOptions{})
		if err != nil || len(again.Applied) != 0 || len(again.Pending) != 0 {
			t.Errorf("second apply: %+v, %v", again, err)
		}

		// Back: the disk and NIC out, the link up, the limit raised.
		v3 := v2
		v3.desc, v3.iops, v3.extraDisk, v3.wan, v3.lanDown, v3.balloonTarget = "v3", 2000, false, false, false, "256M"
		f3 := v3.write(t, path, images)
		if res, err := sup.Apply(ctx, f3, supervisor.ApplyOptions{}); err != nil || len(res.Applied) != 6 {
			t.Fatalf("apply v3: %+v, %v", res, err)
		}
		expectPlan(t, ctx, sup, f3)
		if got := balloonActual(t, ctx, sup, "apply", 256<<20); got != 256<<20 {
			t.Errorf("the balloon's actual is %d, want %d (balloon_target = 256M)", got, 256<<20)
		}
		if macs := g.run(`cat /sys/class/net/*/address`); strings.Contains(strings.ToLower(macs), strings.ToLower(f2.VM.NICs[1].MAC)) {
			t.Errorf("nic wan (%s) is still in the guest: %s", f2.VM.NICs[1].MAC, macs)
		}
		if !g.gone("extra", 20*time.Second) {
			t.Error("disk extra is still in the guest")
		}
		if got := carrier(g, f3.VM.NICs[0].MAC); got != "1" {
			t.Errorf("lan carrier %q after link = up", got)
		}
		// At 2000 the 40 reads are not held back (a loaded host still
		// slows the guest's own dd: the bound is loose on purpose).
		if fast := dd(g); fast > slow*9/10 {
			t.Errorf("40 reads at iops = 2000 took %s (at 10: %s)", fast, slow)
		} else {
			t.Logf("dd of 40 blocks: %s at iops = 10, %s at iops = 2000", slow, fast)
		}
		v1 = v3
	})

	t.Run("refused", func(t *testing.T) {
		// A guest that does not release a disk (paused, it cannot answer):
		// reported after the unplug timeout, and plan still says so.
		g := g.in(t)
		with := v1
		with.extraDisk = true
		if _, err := sup.Apply(ctx, with.write(t, path, images), supervisor.ApplyOptions{}); err != nil {
			t.Fatal(err)
		}
		g.devOf("extra")
		impatient, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps,
			JournalDir: env.Systemd.JournalDir, Self: vmsupBin, UnplugTimeout: 3 * time.Second, AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs})
		if err != nil {
			t.Fatal(err)
		}
		defer impatient.Close()
		if err := sup.Pause(ctx, "apply"); err != nil {
			t.Fatal(err)
		}
		without := v1.write(t, path, images)
		_, err = impatient.Apply(ctx, without, supervisor.ApplyOptions{})
		if err == nil || !strings.Contains(err.Error(), "the guest did not release device disk-extra within 3s") {
			t.Errorf("apply of an unplug the guest ignores: %v", err)
		}
		p, _ := sup.Plan(ctx, without)
		if len(p.Changes) != 1 || p.Changes[0].Kind != plan.DiskRemove {
			t.Errorf("plan after the refused unplug:\n%s", planLines(p.Changes))
		}
		if err := sup.Resume(ctx, "apply"); err != nil {
			t.Fatal(err)
		}
		if _, err := sup.Apply(ctx, without, supervisor.ApplyOptions{}); err != nil {
			t.Fatalf("apply once the guest runs: %v", err)
		}
		expectPlan(t, ctx, sup, without)
		if !g.gone("extra", 20*time.Second) {
			t.Error("disk extra is still in the guest")
		}
	})

	t.Run("killed", func(t *testing.T) { applyKilled(t, ctx, sup, root, path, images, v1) })

	t.Run("reboot", func(t *testing.T) {
		v4 := v1
		v4.cmdline = " vmsup.gen=v4"
		f4 := v4.write(t, path, images)
		res, err := sup.Apply(ctx, f4, supervisor.ApplyOptions{})
		if err != nil || !res.AtReboot || len(res.Pending) != 1 || res.Pending[0].Class != plan.Reboot {
			t.Fatalf("apply of a boot setting: %+v, %v", res, err)
		}
		before, _ := sup.Status(ctx, "apply")
		if !before.PendingAtReboot || len(before.Pending) != 1 {
			t.Errorf("status before the reboot: pending %q at reboot %v", before.Pending, before.PendingAtReboot)
		}
		if _, _, err := g.sh.Run(ctx, "(sleep 1; reboot -f) </dev/null >/dev/null 2>&1 & true"); err != nil {
			t.Fatal(err)
		}
		st := waitGeneration(t, ctx, sup, "apply", before.Generation)
		g2 := bootGuest(t, ctx, st)
		if cl := g2.run("cat /proc/cmdline"); !strings.Contains(cl, "vmsup.gen=v4") {
			t.Errorf("after the guest's reboot, its command line is %q", cl)
		}
		expectPlan(t, ctx, sup, f4)
		g = g2
		v1 = v4
	})

	t.Run("restart", func(t *testing.T) {
		// max_cpus, and a disk outside the image directories, which the
		// running QEMU cannot open: plan says so (restart), as apply does.
		v5 := v1
		v5.maxCPUs, v5.outside = 3, filepath.Join(t.TempDir(), "outside.qcow2")
		f5 := v5.write(t, path, images)
		p, err := sup.Plan(ctx, f5)
		if err != nil || len(p.Changes) != 2 || p.Changes[0].Field != "disk[outside]" || p.Changes[0].Class != plan.Restart ||
			!strings.Contains(p.Changes[0].Why, "outside the image directories") {
			t.Fatalf("plan of a disk outside the image directories: %v\n%s", err, planLines(p.Changes))
		}
		res, err := sup.Apply(ctx, f5, supervisor.ApplyOptions{})
		if err != nil || res.AtReboot || len(res.Pending) != 2 || !strings.Contains(res.Note, "need a restart") {
			t.Fatalf("apply without --restart: %+v, %v", res, err)
		}
		if res, err = sup.Apply(ctx, f5, supervisor.ApplyOptions{Restart: true}); err != nil || !res.Restarted {
			t.Fatalf("apply --restart: %+v, %v", res, err)
		}
		st, _ := sup.Status(ctx, "apply")
		g = bootGuest(t, ctx, st)
		if got := g.run("cat /sys/devices/system/cpu/possible"); got != "0-2" {
			t.Errorf("possible cpus %q after max_cpus = 3", got)
		}
		g.devOf("outside")
		expectPlan(t, ctx, sup, f5)

		// A gate the new spec cannot pass: the previous spec comes back.
		v6 := v5
		v6.maxCPUs, v6.health, v6.within = 4, "VMSUP-NEVER-PRINTED", "8s"
		f6 := v6.write(t, path, images)
		_, err = sup.Apply(ctx, f6, supervisor.ApplyOptions{Restart: true})
		if err == nil || !strings.Contains(err.Error(), "health gate failed") || !strings.Contains(err.Error(), "runs again with its previous spec") {
			t.Fatalf("apply --restart with a failing gate: %v", err)
		}
		st, _ = sup.Status(ctx, "apply")
		g = bootGuest(t, ctx, st)
		if got := g.run("cat /sys/devices/system/cpu/possible"); st.State != supervisor.StateRunning || got != "0-2" {
			t.Errorf("after the rollback: %s, possible cpus %q (want the previous 0-2)", st.State, got)
		}
		p, err = sup.Plan(ctx, f6)
		if err != nil || len(p.Changes) != 1 || p.Changes[0].Field != "max_cpus" || p.Changes[0].Class != plan.Restart {
			t.Errorf("plan after the rollback: %v\n%s", err, planLines(p.Changes))
		}
	})
}

// expectPlan fails unless f's VM runs f exactly.
func expectPlan(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File) {
	t.Helper()
	p, err := sup.Plan(ctx, f)
	if err != nil || !p.InSync {
		t.Fatalf("plan after apply: %v, running %v:\n%s", err, p.Running, planLines(p.Changes))
	}
}

func planLines(cs []plan.Change) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString("  " + c.String() + "\n")
	}
	return b.String()
}

func memKB(g *guest) int64 {
	kb, _ := strconv.ParseInt(g.run(`for i in $(seq 50); do awk '/^MemTotal:/ {print $2}' /proc/meminfo; sleep 0.1; done | tail -1`), 10, 64)
	return kb
}

// carrier is the carrier of the guest NIC with mac, once it settles.
func carrier(g *guest, mac string) string {
	return g.run(fmt.Sprintf(`for n in /sys/class/net/*; do grep -qi %s $n/address && N=$n; done; ip link set ${N##*/} up; sleep 0.5; cat $N/carrier`, mac))
}

// unitProp reads a property of the VM's unit.
func unitProp(t *testing.T, ctx context.Context, vm, prop string) string {
	t.Helper()
	out, err := env.Systemd.Systemctl(ctx, "show", "-p", prop, "--value", "vmsup-"+vm+".service")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// waitGeneration waits until the VM runs a generation after gen and the
// guardian that started it has ended.
func waitGeneration(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string, gen int) supervisor.Status {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := sup.Status(ctx, vm)
		// The guardian holds the VM's lock until its health gate passes,
		// after the VM runs: the next command would find it busy.
		_, guarding := env.Systemd.Systemctl(ctx, "is-active", "--quiet", "vmsup-"+vm+"@reboot.service")
		if err == nil && st.State == supervisor.StateRunning && st.Generation > gen && guarding != nil {
			return st
		}
		time.Sleep(500 * time.Millisecond)
	}
	st, err := sup.Status(ctx, vm)
	con, _ := os.ReadFile(st.ConsoleLog)
	j1, _ := env.Systemd.Journal(ctx, "vmsup-"+vm+".service")
	j2, _ := env.Systemd.Journal(ctx, "vmsup-"+vm+"@reboot.service")
	t.Fatalf("%s did not come back with a generation after %d: %s (generation %d), %v\nconsole:\n%s\nunit:\n%s\nguardian:\n%s",
		vm, gen, st.State, st.Generation, err, tail(string(con), 1500), tail(j1, 3000), tail(j2, 2000))
	return st
}

// applyKilled: apply killed (SIGKILL, in a child process) after each live
// change it makes; each time the next plan says exactly what QEMU still
// lacks, and the next apply converges.
func applyKilled(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, root, path, images string, base applyCfg) {
	k := base
	k.desc, k.iops, k.extraDisk, k.lanDown, k.cpuQuota = "killed", 10, true, true, 80
	// The VM's own file, edited back and forth (another file would not
	// be its own: refused); the job applies what it holds then.
	fb := base.write(t, path, images)
	fk := k.write(t, path, images)
	job := supervisortest.FaultJob{Root: root, Bus: env.Systemd.BusAddress, JournalDir: env.Systemd.JournalDir, QEMU: env.QEMU, Self: vmsupBin,
		HostCache: env.CapsCache, Op: "apply", VM: "apply", File: path, Trace: filepath.Join(t.TempDir(), "trace")}
	if killed, out, _ := supervisortest.RunJob(t, ctx, job, 0); killed || strings.TrimSpace(out) != "" {
		t.Fatalf("clean apply: killed %v: %s", killed, out)
	}
	b, _ := os.ReadFile(job.Trace)
	var points []string // the step that ends each live change
	for _, st := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if st == `disk "extra": record` || strings.HasPrefix(st, "disk[") || strings.HasPrefix(st, "nic[") || st == "description" || strings.HasPrefix(st, "limits.") {
			points = append(points, st)
		}
	}
	if len(points) != 5 {
		t.Fatalf("live changes in the trace: %q", points)
	}
	revert := func() {
		t.Helper()
		if _, err := sup.Apply(ctx, fb, supervisor.ApplyOptions{}); err != nil {
			t.Fatalf("revert: %v", err)
		}
		expectPlan(t, ctx, sup, fb)
		k.write(t, path, images) // what the next job applies
	}
	revert()
	for _, point := range points {
		j := job
		j.KillAfter, j.Trace = point, ""
		if killed, out, _ := supervisortest.RunJob(t, ctx, j, 0); !killed {
			t.Fatalf("not killed after %q: %s", point, out)
		}
		p, err := sup.Plan(ctx, fk)
		if err != nil {
			t.Fatalf("plan after a kill after %q: %v", point, err)
		}
		has := map[plan.Kind]bool{}
		for _, c := range p.Changes {
			has[c.Kind] = true
		}
		q := qemuDisks(t, ctx, sup, "apply")
		_, plugged := q["disk-extra"]
		if has[plan.DiskAdd] == plugged {
			t.Errorf("killed after %q: plan has disk-add %v, QEMU has the disk %v", point, has[plan.DiskAdd], plugged)
		}
		if has[plan.DiskLimits] == (q["disk-data"] == 10) {
			t.Errorf("killed after %q: plan has io-limits %v, QEMU's iops %d", point, has[plan.DiskLimits], q["disk-data"])
		}
		if quota := unitProp(t, ctx, "apply", "CPUQuotaPerSecUSec"); has[plan.UnitLimits] == (quota == "800ms") {
			t.Errorf("killed after %q: plan has unit limits %v, the unit's quota %s", point, has[plan.UnitLimits], quota)
		}
		if _, err := sup.Apply(ctx, fk, supervisor.ApplyOptions{}); err != nil {
			t.Fatalf("apply after a kill after %q: %v", point, err)
		}
		expectPlan(t, ctx, sup, fk)
		if q := qemuDisks(t, ctx, sup, "apply"); q["disk-data"] != 10 {
			t.Errorf("after converging: QEMU's disks %v", q)
		}
		revert()
	}
	t.Logf("apply killed after each of its %d live changes: plan truthful, apply converged", len(points))
}

// qemuDisks maps the VM's block devices (qdev id) to their iops limit.
func qemuDisks(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string) map[string]int64 {
	t.Helper()
	reply, err := sup.QMP(ctx, vm, []byte(`{"execute":"query-block"}`), true)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Return []struct {
			Qdev     string `json:"qdev"`
			Inserted *struct {
				IOPS int64 `json:"iops"`
			} `json:"inserted"`
		} `json:"return"`
	}
	if err := json.Unmarshal(reply, &r); err != nil {
		t.Fatalf("query-block: %v: %s", err, reply)
	}
	out := map[string]int64{}
	for _, d := range r.Return {
		// A virtio-blk's backend is its child: /machine/peripheral/disk-NAME/virtio-backend.
		id := strings.TrimPrefix(strings.TrimSuffix(d.Qdev, "/virtio-backend"), "/machine/peripheral/")
		out[id] = 0
		if d.Inserted != nil {
			out[id] = d.Inserted.IOPS
		}
	}
	return out
}

// balloonActual waits (up to 30 s) for the guest's balloon to reach want and
// returns what QEMU reports last.
func balloonActual(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string, want int64) int64 {
	t.Helper()
	var got int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		reply, err := sup.QMP(ctx, vm, []byte(`{"execute":"query-balloon"}`), true)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Return struct {
				Actual int64 `json:"actual"`
			} `json:"return"`
		}
		json.Unmarshal(reply, &r)
		if got = r.Return.Actual; got == want {
			break
		}
	}
	return got
}
