package realguesttest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/backupchain"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// testSnapshot: a disk snapshot is quiesced by the guest agent, and the
// guest's own journal shows qemu-ga freezing and thawing its filesystems;
// the snapshot merges away live, and the data disk still grows by apply
// after the merge.
func testSnapshot(t *testing.T, ctx context.Context, g *realGuest) {
	res, err := g.sup.Snapshot(ctx, vmName, "s1", supervisor.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: disks %v, quiesced %q, guest frozen %s", res.Disks, res.Quiesced, res.Pause.Round(time.Millisecond))
	if !strings.Contains(res.Quiesced, "agent") && !strings.Contains(res.Quiesced, "freeze") {
		t.Errorf("snapshot quiesced %q, want by the guest agent's fsfreeze", res.Quiesced)
	}
	// qemu-ga logs each command to syslog (the journal), but none while
	// the filesystems are frozen: the thaw shows as writes working again.
	j := g.sh(t, ctx, "journalctl --no-pager -b -o short-monotonic -t qemu-ga | grep -i 'fsfreeze called' || true")
	if !strings.Contains(j, "guest-fsfreeze called") {
		t.Errorf("the guest's journal shows no fsfreeze by qemu-ga:\n%s", j)
	}
	t.Logf("the guest's journal: %s", j)
	g.sh(t, ctx, "echo thawed > /root/thawed && sync")
	growRefusedInSnapshot(t, ctx, g)
	if err := g.sup.RemoveSnapshot(ctx, vmName, "s1", nil); err != nil {
		t.Fatalf("snapshot rm (live merge): %v", err)
	}
	g.sh(t, ctx, "echo after-merge > /root/after-merge && sync")
	// Both disks grow after the merge: the root disk's node is the one
	// the merge left active (an overlay's base), the data disk's its own.
	g.rootSize = "3G"
	growData(t, ctx, g, "128M")
	if got := g.sh(t, ctx, "blockdev --getsize64 /dev/vda"); got != "3221225472" {
		t.Errorf("the guest's /dev/vda has %s bytes after apply, want 3 GiB", got)
	}
}

// growRefusedInSnapshot: while the data disk is in a snapshot, plan says
// its growth cannot be done (naming the snapshots), and apply refuses it
// the same way (plan said "live" where apply refused).
func growRefusedInSnapshot(t *testing.T, ctx context.Context, g *realGuest) {
	f := g.writeFile(t, "112M")
	p, err := g.sup.Plan(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Changes {
		t.Logf("plan in a snapshot: %+v", c)
		if c.Class != plan.Impossible || !strings.Contains(c.Why, "snapshot") {
			t.Errorf("plan of a disk grown in a snapshot: %+v, want impossible, naming the snapshots", c)
		}
	}
	if _, err := g.sup.Apply(ctx, f, supervisor.ApplyOptions{}); err == nil || !strings.Contains(err.Error(), "snapshot") {
		t.Errorf("apply of a disk grown in a snapshot: %v, want a refusal naming the snapshots", err)
	} else {
		t.Logf("apply in a snapshot: %v", err)
	}
	g.writeFile(t, grownSize) // the file as the VM is
}

// testBackup: a full and an incremental backup of the running guest; the
// incremental point restored is a filesystem e2fsck finds clean and holds
// what the guest wrote between the points.
func testBackup(t *testing.T, ctx context.Context, g *realGuest) {
	dir := filepath.Join(g.dir, "backup")
	full, err := g.sup.Backup(ctx, vmName, supervisor.BackupOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("full backup: quiesced %q", full.Quiesced)
	if !strings.Contains(full.Quiesced, "agent") && !strings.Contains(full.Quiesced, "freeze") {
		t.Errorf("backup quiesced %q, want by the guest agent's fsfreeze", full.Quiesced)
	}
	g.sh(t, ctx, "echo between-points > /root/between && sync")
	inc, err := g.sup.Backup(ctx, vmName, supervisor.BackupOptions{Dir: dir, Incremental: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range inc.Disks {
		t.Logf("point %d disk %s: %s, %d bytes copied (full: %d)", inc.Point, d.Disk, d.Mode, d.Copied, copiedOf(full, d.Disk))
		if d.Mode != backupchain.Incremental {
			t.Errorf("disk %s: point %d is %s (%s), want incremental", d.Disk, inc.Point, d.Mode, d.Reason)
		}
	}
	g.restored = filepath.Join(g.dir, "restored-root.qcow2")
	if _, err := g.sup.Restore(ctx, supervisor.RestoreOptions{Dir: dir, Disk: "root", Point: inc.Point, To: g.restored}); err != nil {
		t.Fatal(err)
	}
	report, clean := fsck(t, g.restored)
	if !clean {
		t.Errorf("restored point %d of disk root is not a clean filesystem (the backup is crash-consistent: nothing froze the guest's filesystems):\n%s", inc.Point, report)
	} else {
		t.Logf("restored point %d: %s", inc.Point, report)
	}
}

func copiedOf(r supervisor.BackupResult, disk string) int64 {
	for _, d := range r.Disks {
		if d.Disk == disk {
			return d.Copied
		}
	}
	return 0
}

// fsck reads the ext4 filesystem on a whole-disk image (any format): the
// superblock's state and features, and e2fsck's read-only verdict. It is
// clean when the superblock says so, no journal awaits recovery, and
// e2fsck -fn finds nothing.
func fsck(t *testing.T, image string) (string, bool) {
	t.Helper()
	raw := image + ".fsck.raw"
	if out, err := exec.Command("qemu-img", "convert", "-O", "raw", image, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert %s: %v\n%s", image, err, out)
	}
	defer os.Remove(raw)
	sb, err := exec.Command("dumpe2fs", "-h", raw).Output()
	if err != nil {
		t.Fatalf("dumpe2fs -h %s: %v", image, err)
	}
	var state, features string
	for _, l := range strings.Split(string(sb), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			switch k {
			case "Filesystem state":
				state = strings.TrimSpace(v)
			case "Filesystem features":
				features = strings.TrimSpace(v)
			}
		}
	}
	out, err := exec.Command("e2fsck", "-fn", raw).CombinedOutput()
	recovery := strings.Contains(features, "needs_recovery")
	report := "state " + state + ", journal recovery needed " + map[bool]string{true: "yes", false: "no"}[recovery] +
		", e2fsck -fn: " + map[bool]string{true: "clean", false: "errors"}[err == nil]
	if err != nil {
		report += "\n" + string(out)
	}
	return report, state == "clean" && !recovery && err == nil
}

// testReboot: the guest reboots (QEMU keeps running) by the given way,
// through systemd's orderly shutdown, and comes back.
func testReboot(t *testing.T, ctx context.Context, g *realGuest, mode supervisor.RebootMode) {
	prev := g.bootID
	// cloud-init's four stages cost about 80 s of each boot under TCG and
	// have nothing left to do (their seed was checked above; the backup's
	// restored image keeps them on): the reboots are systemd's and vmsup's.
	g.sh(t, ctx, "touch /etc/cloud/cloud-init.disabled && sync")
	res, err := g.sup.Reboot(ctx, vmName, mode)
	if err != nil {
		t.Fatal(err)
	}
	if res.Via != string(mode) {
		t.Errorf("rebooted via %q, want %q", res.Via, mode)
	}
	g.waitBoot(t, ctx, bootTimeout)
	target := "System Reboot"
	if mode == supervisor.RebootACPI {
		target = "System Power Off" // the guest powers off; QEMU resets it
	}
	last := g.sh(t, ctx, "journalctl --no-pager -b -1 -o cat | grep -E 'Reached target .*(System Reboot|System Power Off)' | tail -n 1")
	if !strings.Contains(last, target) {
		t.Errorf("boot %s did not end through systemd's %q: %q", prev, target, last)
	}
	t.Logf("boot %s ended with %q", prev, last)
	if out := g.sh(t, ctx, "journalctl --no-pager -b -k -o cat | grep -iE 'EXT4-fs.*recover' || true"); out != "" {
		t.Errorf("the boot after the reboot recovered the root filesystem:\n%s", out)
	}
}

// testMigrateLocal: migrate --local of the guest, whose NIC is a tap on the
// managed network's bridge (the new QEMU gets a second tap there): an ssh
// session opened before it answers after it on the same connection, and
// the guest's DHCP address is unchanged.
func testMigrateLocal(t *testing.T, ctx context.Context, g *realGuest) {
	s := g.startSession(t, ctx)
	defer s.close()
	s.roundTrip(t, "before")
	t0 := time.Now()
	res, err := g.sup.Migrate(ctx, vmName, supervisor.MigrateOptions{Local: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("migrated locally in %s: mode %s, %+v", time.Since(t0).Round(100*time.Millisecond), res.Mode, res)
	s.roundTrip(t, "after")
	g.waitAgent(t, ctx)
	if out := g.sh(t, ctx, "ip -4 -o addr show scope global"); !strings.Contains(out, " "+g.ip+"/") {
		t.Errorf("the guest's address after migrate --local: %q, want %s", out, g.ip)
	}
	if out, err := g.ssh(ctx, "hostname"); err != nil || out != seedHost {
		t.Errorf("a new ssh after migrate --local: %v %q", err, out)
	}
}

// testHotplugCPUMemory: vmsup set adds a vCPU and a DIMM; QEMU survives
// it under TCG and the guest has both online.
func testHotplugCPUMemory(t *testing.T, ctx context.Context, g *realGuest) {
	before := g.sh(t, ctx, "grep MemTotal /proc/meminfo")
	res, err := g.sup.Resize(ctx, vmName, supervisor.ResizeOptions{CPUs: 2, Memory: 1280 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("set: %+v", res)
	if st, err := g.sup.Status(ctx, vmName); err != nil || st.State != supervisor.StateRunning {
		t.Fatalf("after set: %s %v", st.State, err)
	}
	w := testenv.StartGuestWait("the guest sees a hot-plugged vCPU and DIMM", 30*time.Second)
	var cpus, offline string
	for {
		cpus = g.sh(t, ctx, "cat /sys/devices/system/cpu/online; ls -d /sys/devices/system/cpu/cpu[0-9]* | wc -l")
		offline = g.sh(t, ctx, "grep -l offline /sys/devices/system/memory/memory*/state | wc -l")
		if cpus == "0-1\n2" && offline == "0" {
			break
		}
		if w.Expired() {
			t.Errorf("hot-plugged vCPU or memory not online in the guest: online CPUs, CPUs %q; offline memory blocks %s: %s",
				cpus, offline, w.Explain())
			break
		}
		time.Sleep(time.Second)
	}
	t.Logf("MemTotal %s -> %s", strings.Fields(before)[1], strings.Fields(g.sh(t, ctx, "grep MemTotal /proc/meminfo"))[1])
}

// testDown: vmsup down powers the guest off through systemd (ACPI, within
// the stop timeout: not QMP quit), and its root filesystem is left clean.
func testDown(t *testing.T, ctx context.Context, g *realGuest) {
	t0 := time.Now()
	res, err := g.sup.Down(ctx, vmName)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("down: %s in %s", res.Step, time.Since(t0).Round(100*time.Millisecond))
	if res.Step != supervisor.StoppedACPI {
		t.Errorf("down ended by %q, want the guest's own power-off after ACPI (%q)", res.Step, supervisor.StoppedACPI)
	}
	report, clean := fsck(t, filepath.Join(g.dir, "root.qcow2"))
	if !clean {
		t.Errorf("the root filesystem after down is not clean:\n%s", report)
	}
	t.Logf("root after down: %s", report)
}

// testRestoredBoots: the restored backup boots as a VM of its own and has
// what the guest wrote before the incremental point.
func testRestoredBoots(t *testing.T, ctx context.Context, g *realGuest) {
	if g.restored == "" {
		t.Skip("no restored image (backup-restore failed)")
	}
	name := "rgrestored"
	body := strings.Replace(vmTOML(g.dir, "", dataSize, ""), `name = "`+vmName+`"`, `name = "`+name+`"`, 1)
	body = strings.Replace(body, filepath.Join(g.dir, "root.qcow2"), g.restored, 1)
	body = strings.Replace(body, `backing = "`+filepath.Join(imageDir, "disk.qcow2")+`"`, "", 1)
	body, _, _ = strings.Cut(body, "[[disk]]\nname = \"data\"")
	f := supervisortest.LoadTOML(t, t.TempDir(), name, body)
	if _, err := g.sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer g.sup.DownWith(context.Background(), name, supervisor.DownOptions{Force: true})
	st, err := g.sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	r := &realGuest{sup: g.sup, name: name, console: st.ConsoleLog}
	r.waitBoot(t, ctx, bootTimeout)
	if out := r.sh(t, ctx, "cat /root/between"); out != "between-points" {
		t.Errorf("the restored guest's /root/between: %q", out)
	}
	if out := r.sh(t, ctx, "journalctl --no-pager -b -k -o cat | grep -iE 'EXT4-fs.*recover' || true"); out != "" {
		t.Logf("the restored root needed journal recovery at boot (crash-consistent):\n%s", out)
	}
}
