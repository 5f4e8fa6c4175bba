package supervisor_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/supervisor"
)

// patternOff is where the guest writes its patterns on each disk (1 MiB).
const patternOff = 1 << 20

// guest runs shell commands on one booted test guest.
type guest struct {
	t  *testing.T
	sh *testenv.GuestShell
}

func bootGuest(t *testing.T, ctx context.Context, st supervisor.Status) *guest {
	t.Helper()
	waitConsole(t, st, testenv.ShellMarker, 3*time.Minute)
	sh, err := testenv.DialConsole(ctx, st.Console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sh.Close() })
	g := &guest{t: t, sh: sh}
	g.run("dmesg -n 1") // keep kernel messages (hotplug) out of command output
	return g
}

// in returns g reporting failures to t (a subtest).
func (g *guest) in(t *testing.T) *guest { return &guest{t: t, sh: g.sh} }

func (g *guest) run(cmd string) string {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out, code, err := g.sh.Run(ctx, cmd)
	if err != nil || code != 0 {
		g.t.Fatalf("guest: %s: exit %d, %v\n%s", cmd, code, err, out)
	}
	return out
}

// dev waits until the guest has a virtio disk with this serial and returns
// its device node ("" if it does not appear within wait).
func (g *guest) dev(serial string, wait time.Duration) string {
	g.t.Helper()
	n := int(wait / (200 * time.Millisecond))
	return g.run(fmt.Sprintf(`d=; for i in $(seq %d); do for b in /sys/block/vd*; do [ "$(cat $b/serial 2>/dev/null)" = %q ] && d=/dev/${b##*/}; done; [ -n "$d" ] && break; sleep 0.2; done; echo $d`, n, serial))
}

// gone waits until the guest has no disk with this serial and returns
// whether it went within wait.
func (g *guest) gone(serial string, wait time.Duration) bool {
	g.t.Helper()
	n := int(wait / (200 * time.Millisecond))
	out := g.run(fmt.Sprintf(`r=present; for i in $(seq %d); do d=; for b in /sys/block/vd*; do [ "$(cat $b/serial 2>/dev/null)" = %q ] && d=1; done; [ -z "$d" ] && { r=gone; break; }; sleep 0.2; done; echo $r`, n, serial))
	return out == "gone"
}

// devOf is dev that must find the disk.
func (g *guest) devOf(serial string) string {
	g.t.Helper()
	d := g.dev(serial, 15*time.Second)
	if !strings.HasPrefix(d, "/dev/vd") {
		lsblk := g.run(`for b in /sys/block/*; do echo ${b##*/} $(cat $b/serial 2>/dev/null); done`)
		g.t.Fatalf("guest has no disk with serial %q (%q); block devices:\n%s", serial, d, lsblk)
	}
	return d
}

func (g *guest) write(dev, pattern string) {
	g.t.Helper()
	g.run(fmt.Sprintf("printf '%%s' %q | dd of=%s bs=512 seek=%d conv=notrunc 2>/dev/null && sync", pattern, dev, patternOff/512))
}

func (g *guest) read(dev string, n int) string {
	g.t.Helper()
	return g.run(fmt.Sprintf("dd if=%s bs=512 skip=%d count=1 2>/dev/null | head -c %d", dev, patternOff/512, n))
}

// cdroms mounts every CD-ROM the guest has and prints the files on them.
func (g *guest) cdroms(want int) string {
	g.t.Helper()
	return g.run(fmt.Sprintf(`for i in $(seq 75); do [ $(ls /dev/sr* 2>/dev/null | wc -l) -ge %d ] && break; sleep 0.2; done
for s in /dev/sr*; do m=/mnt/${s##*/}; mkdir -p $m; mountpoint -q $m || mount -t iso9660 -o ro $s $m || exit 1; for f in $m/*; do echo "$s ${f##*/}: $(cat $f)"; done; done`, want))
}

func randPattern(name string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return "VMSUP-" + name + "-" + hex.EncodeToString(b)
}

func sha(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func qemuImgT(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

// TestStorageKinds boots one guest with a disk of every kind (qcow2 overlay
// on a shared base, raw file created on demand, raw block device, ISO,
// cloud-init seed, iSCSI without and with CHAP, Ceph RBD with cephx), writes
// a pattern to each writable one, checks it on the host through the target
// itself, restarts the VM and reads everything back. On the way it
// hot-plugs a qcow2 and an iSCSI disk, shows that secrets never reach argv,
// and that a second VM cannot open the first one's writable image.
func TestStorageKinds(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	dir := t.TempDir()
	sup := newSup(t, "")

	// Base image with a known byte pattern at 2 MiB, shared read-only.
	base := filepath.Join(dir, "base.qcow2")
	qemuImgT(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "32M")
	qemuImgT(t, "qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 2M 4k", base)
	baseSum := sha(t, base)

	loopDev, loopFile := loopDevice(t, 16<<20)
	lunIQN, lunFile := newLUN(t, "kinds-lun", 16<<20, false)
	chapIQN, chapFile := newLUN(t, "kinds-chap", 16<<20, true)
	hotIQN, hotFile := newLUN(t, "kinds-hot", 16<<20, true)
	ceph := needCeph(t)
	t.Logf("tgt and Ceph up in %s (shared by the package)", targets.Started)
	newRBD(t, "kinds-vol", "16M")

	chapSecret := filepath.Join(dir, "chap.secret")
	cephKey := filepath.Join(dir, "ceph.key")
	if err := os.WriteFile(chapSecret, []byte(chapPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cephKey, []byte(ceph.AdminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	isoPattern := randPattern("iso")
	iso := filepath.Join(dir, "data.iso")
	if err := storage.BuildISO(iso, "VMSUPDATA", map[string][]byte{"pattern.txt": []byte(isoPattern)}); err != nil {
		t.Fatal(err)
	}
	seedPattern := randPattern("seed")
	rawFile := filepath.Join(dir, "raw.img")

	disks := fmt.Sprintf(`
[[disk]]
name = "root"
file = "vm.qcow2"
backing = %q
size = "64M"
serial = "root"

[[disk]]
name = "raw"
file = %q
format = "raw"
size = "16M"
serial = "raw"
discard = true
boot_index = 2

[[disk]]
name = "blk"
type = "block"
file = %q
serial = "blk"
cache = "none"
aio = "native"

[[disk]]
name = "iso"
type = "iso"
file = %q

[[disk]]
name = "cidata"
type = "seed"
user_data = "#cloud-config\nfqdn: %s\n"

[[disk]]
name = "lun"
type = "iscsi"
portal = %q
target = %q
lun = 1
serial = "lun"

[[disk]]
name = "chap"
type = "iscsi"
portal = %q
target = %q
lun = 1
user = %q
secret_file = %q
serial = "chap"
iothread = true

[[disk]]
name = "vol"
type = "rbd"
pool = %q
image = "kinds-vol"
monitors = [%q]
user = "admin"
secret_file = %q
serial = "vol"
`, base, rawFile, loopDev, iso, seedPattern, targets.TGT.Portal, lunIQN, targets.TGT.Portal, chapIQN, chapUser, chapSecret,
		ceph.Pool, ceph.MonAddr, cephKey)
	f := guestFile(t, dir, "kinds", disks)

	t0 := time.Now()
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Logf("up with 8 disks (checks, image creation, seed, QEMU) in %s", time.Since(t0))
	st, err := sup.Status(ctx, "kinds")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "vm.qcow2")); err != nil {
		t.Fatalf("overlay not created: %v", err)
	}

	t.Run("secrets-not-in-argv", func(t *testing.T) {
		checkNoSecrets(t, ctx, sup, f, st, chapPassword, ceph.AdminKey)
	})

	g := bootGuest(t, ctx, st)
	patterns := map[string]string{}
	for _, name := range []string{"root", "raw", "blk", "lun", "chap", "vol"} {
		patterns[name] = randPattern(name)
		g.write(g.devOf(name), patterns[name])
	}
	if got := g.run(fmt.Sprintf("dd if=%s bs=4096 skip=512 count=1 2>/dev/null | head -c 4", g.devOf("root"))); got != "ZZZZ" {
		t.Errorf("overlay does not show its base's data at 2 MiB: %q", got)
	}
	cds := g.cdroms(2)
	if !strings.Contains(cds, "pattern.txt: "+isoPattern) || !strings.Contains(cds, "user-data: #cloud-config") ||
		!strings.Contains(cds, "fqdn: "+seedPattern) || !strings.Contains(cds, "meta-data: instance-id: kinds") {
		t.Errorf("guest CD-ROMs:\n%s", cds)
	}

	// The host sees the guest's writes through each target itself.
	for _, c := range []struct{ name, file string }{{"raw", rawFile}, {"blk", loopFile}, {"lun", lunFile}, {"chap", chapFile}} {
		if got := readAt(t, c.file, patternOff, len(patterns[c.name])); got != patterns[c.name] {
			t.Errorf("host reads %q from %s (disk %s), want %q", got, c.file, c.name, patterns[c.name])
		}
	}
	exported := filepath.Join(dir, "vol.export")
	if out, err := ceph.RBD(ctx, "export", ceph.Pool+"/kinds-vol", exported); err != nil {
		t.Fatalf("rbd export: %v %s", err, out)
	}
	if got := readAt(t, exported, patternOff, len(patterns["vol"])); got != patterns["vol"] {
		t.Errorf("rbd export has %q, want %q", got, patterns["vol"])
	}

	t.Run("hotplug", func(t *testing.T) {
		patterns["hq"] = hotplug(t, ctx, sup, g.in(t), dir, hotIQN, hotFile, chapSecret)
	})
	// Leave a qcow2 attached: the next up boots with it.
	hq, err := spec.CheckDisk("test", spec.Disk{Name: "hq", File: filepath.Join(sup.Root(), "images", "hot.qcow2"), Serial: "hq"}, "kinds")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.AttachDisk(ctx, "kinds", *hq); err != nil {
		t.Fatal(err)
	}
	if got := g.read(g.devOf("hq"), len(patterns["hq"])); got != patterns["hq"] {
		t.Fatalf("re-attached qcow2 reads %q, want %q", got, patterns["hq"])
	}

	// Down and up: every pattern is still there.
	if _, err := sup.Down(ctx, "kinds"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(st.StateDir, "secrets")); !os.IsNotExist(err) {
		t.Errorf("secrets left in the state dir after down: %v", err)
	}
	if sha(t, base) != baseSum {
		t.Error("the shared base image was written")
	}
	os.Remove(st.ConsoleLog)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if res, err := sup.Up(ctx, f); err != nil || res[0].Action != supervisor.Unchanged {
		t.Errorf("second up with an attached disk: %+v %v (want unchanged)", res, err)
	}
	st2, _ := sup.Status(ctx, "kinds")
	if !slices.Equal(st2.AttachedDisks, []string{"hq"}) {
		t.Errorf("status attached disks %q, want [hq]", st2.AttachedDisks)
	}
	g = bootGuest(t, ctx, st)
	for name, want := range patterns {
		if got := g.read(g.devOf(name), len(want)); got != want {
			t.Errorf("after restart disk %s reads %q, want %q", name, got, want)
		}
	}
	if cds := g.cdroms(2); !strings.Contains(cds, isoPattern) || !strings.Contains(cds, seedPattern) {
		t.Errorf("guest CD-ROMs after restart:\n%s", cds)
	}
	if err := sup.DetachDisk(ctx, "kinds", "hq"); err != nil {
		t.Fatal(err)
	}
	if !g.gone("hq", 10*time.Second) {
		t.Errorf("guest still has hq 10 s after detach")
	}

	t.Run("image-lock", func(t *testing.T) {
		thief := guestFile(t, t.TempDir(), "thief", fmt.Sprintf("[[disk]]\nname = \"stolen\"\nfile = %q\nformat = \"raw\"\n", rawFile))
		_, err := sup.Up(ctx, thief)
		want := `disk[0].file: disk "stolen": ` + rawFile + `: image is in use by another process: VM "kinds" has it open (its disk "raw")`
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("second VM on the same image: %v\nwant one line containing %q", err, want)
		}
		t.Logf("second VM: %v", err)
		assertNothingStarted(t, ctx, sup, "thief")
		if got := g.in(t).read(g.in(t).devOf("raw"), len(patterns["raw"])); got != patterns["raw"] {
			t.Errorf("first VM's disk after the failed second VM: %q", got)
		}
		if st, _ := sup.Status(ctx, "kinds"); st.State != supervisor.StateRunning {
			t.Errorf("first VM: %+v", st)
		}
	})

	// A crash (QEMU killed): its stop-post hook removes the CHAP and Ceph
	// key copies at once, not at the next down.
	if _, err := os.Stat(filepath.Join(st.StateDir, "secrets")); err != nil {
		t.Fatalf("no secrets dir while running: %v", err)
	}
	killUnit(t, env.Systemd, "vmsup-kinds.service")
	waitState(t, ctx, sup, "kinds", supervisor.StateCrashed, 30*time.Second)
	if _, err := os.Stat(filepath.Join(st.StateDir, "secrets")); !os.IsNotExist(err) {
		t.Errorf("secrets left in the state dir after a crash: %v", err)
	}
	if _, err := sup.Down(ctx, "kinds"); err != nil {
		t.Fatal(err)
	}
	// Attaching to a shut-off VM records the disk for its next up.
	late, _ := spec.CheckDisk("test", spec.Disk{Name: "late", File: filepath.Join(dir, "late.qcow2"), Size: 16 * spec.MiB}, "kinds")
	if res, err := sup.AttachDisk(ctx, "kinds", *late); err != nil || res.Bus != "" {
		t.Fatalf("attach to a shut-off VM: %+v %v", res, err)
	}
	if st, _ := sup.Status(ctx, "kinds"); st.State != supervisor.StateShutOff || !slices.Equal(st.AttachedDisks, []string{"late"}) {
		t.Errorf("status of a shut-off VM with a recorded disk: %+v", st)
	}
	if err := sup.DetachDisk(ctx, "kinds", "late"); err != nil {
		t.Fatal(err)
	}
	if st, _ := sup.Status(ctx, "kinds"); len(st.AttachedDisks) != 0 {
		t.Errorf("after detach from a shut-off VM: %q", st.AttachedDisks)
	}
}

// hotplug attaches a qcow2 and a CHAP iSCSI disk to the running guest,
// writes to both, detaches both and checks that nothing is left behind. It
// returns the pattern written to the qcow2.
func hotplug(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, g *guest, dir, iqn, lunFile, secret string) (hqPattern string) {
	// Hot-plugged images lie in an image directory: the running (confined)
	// unit sees nothing else new.
	hq, err := spec.CheckDisk("test", spec.Disk{Name: "hq", File: filepath.Join(sup.Root(), "images", "hot.qcow2"), Size: 32 * spec.MiB, Serial: "hq"}, "kinds")
	if err != nil {
		t.Fatal(err)
	}
	hi, err := spec.CheckDisk("test", spec.Disk{Name: "hi", Type: spec.DiskISCSI, Portal: targets.TGT.Portal, Target: iqn, LUN: 1,
		User: chapUser, SecretFile: secret, Serial: "hi"}, "kinds")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*spec.Disk{hq, hi} {
		t0 := time.Now()
		res, err := sup.AttachDisk(ctx, "kinds", *d)
		if err != nil {
			t.Fatal(err)
		}
		dev := g.devOf(d.Serial)
		t.Logf("attached %s on %s, guest sees %s after %s", d.Name, res.Bus, dev, time.Since(t0))
		p := randPattern(d.Name)
		if d.Name == "hq" {
			hqPattern = p
		}
		g.write(dev, p)
		if got := g.read(dev, len(p)); got != p {
			t.Errorf("hot-plugged %s reads %q, want %q", d.Name, got, p)
		}
		if d.Name == "hi" {
			if got := readAt(t, lunFile, patternOff, len(p)); got != p {
				t.Errorf("LUN file of hot-plugged iSCSI disk has %q, want %q", got, p)
			}
		}
	}
	st, _ := sup.Status(ctx, "kinds")
	if !slices.Equal(st.AttachedDisks, []string{"hq", "hi"}) {
		t.Errorf("status attached disks %q, want [hq hi]", st.AttachedDisks)
	}
	// A third attach with a clashing name fails and adds nothing.
	if _, err := sup.AttachDisk(ctx, "kinds", *hq); err == nil || !strings.Contains(err.Error(), `already has a disk named "hq"`) {
		t.Errorf("duplicate attach: %v", err)
	}
	for _, name := range []string{"hi", "hq"} {
		t0 := time.Now()
		if err := sup.DetachDisk(ctx, "kinds", name); err != nil {
			t.Fatal(err)
		}
		t.Logf("detached %s in %s", name, time.Since(t0))
		if !g.gone(name, 10*time.Second) {
			t.Errorf("guest still has %s 10 s after detach", name)
		}
	}
	// A raw block device (a loop device standing for an LVM volume): the
	// running unit cannot open new devices, so vmsup passes QEMU an fd.
	hbDev, hbFile := loopDevice(t, 8<<20)
	hb, err := spec.CheckDisk("test", spec.Disk{Name: "hb", Type: spec.DiskBlock, File: hbDev, Format: "raw", Serial: "hb"}, "kinds")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.AttachDisk(ctx, "kinds", *hb); err != nil {
		t.Fatal(err)
	}
	hbPattern := randPattern("hb")
	dev := g.devOf("hb")
	g.write(dev, hbPattern)
	if got := g.read(dev, len(hbPattern)); got != hbPattern {
		t.Errorf("hot-plugged block device reads %q in the guest, want %q", got, hbPattern)
	}
	if got := readAt(t, hbDev, patternOff, len(hbPattern)); got != hbPattern {
		t.Errorf("host reads %q from %s, want %q", got, hbDev, hbPattern)
	}
	if fds, _ := sup.QMP(ctx, "kinds", []byte(`{"execute":"query-fdsets"}`), false); !strings.Contains(string(fds), "vmsup disk hb") {
		t.Errorf("no fd set for hb: %s", fds)
	}
	if err := sup.DetachDisk(ctx, "kinds", "hb"); err != nil {
		t.Fatal(err)
	}
	if !g.gone("hb", 10*time.Second) {
		t.Errorf("guest still has hb 10 s after detach")
	}
	if fds, _ := sup.QMP(ctx, "kinds", []byte(`{"execute":"query-fdsets"}`), false); strings.Contains(string(fds), "vmsup disk hb") {
		t.Errorf("fd set of hb left after detach: %s", fds)
	}
	// Closed by QEMU, the device's cache is written through to the loop's file.
	if got := readAt(t, hbFile, patternOff, len(hbPattern)); got != hbPattern {
		t.Errorf("loop file after detach has %q, want %q", got, hbPattern)
	}

	nodes, err := sup.QMP(ctx, "kinds", []byte(`{"execute":"query-named-block-nodes","arguments":{"flat":true}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := sup.QMP(ctx, "kinds", []byte(`{"execute":"qom-list","arguments":{"path":"/objects"}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, stale := range []string{`"file-hq"`, `"fmt-hq"`, `"file-hi"`, `"fmt-hi"`, `"file-hb"`, `"fmt-hb"`} {
		if strings.Contains(string(nodes), stale) {
			t.Errorf("stale node %s after detach: %s", stale, nodes)
		}
	}
	if strings.Contains(string(objs), `"sec-hi"`) {
		t.Errorf("stale secret object after detach: %s", objs)
	}
	if st, _ := sup.Status(ctx, "kinds"); len(st.AttachedDisks) != 0 {
		t.Errorf("status still lists %q", st.AttachedDisks)
	}

	// A failed attach (device_add refused: boot index 2 is the raw disk's)
	// leaves no node, no record and no image behind.
	hx, err := spec.CheckDisk("test", spec.Disk{Name: "hx", File: filepath.Join(sup.Root(), "images", "hx.qcow2"), Size: 16 * spec.MiB, BootIndex: 2}, "kinds")
	if err != nil {
		t.Fatal(err)
	}
	_, err = sup.AttachDisk(ctx, "kinds", *hx)
	if err == nil || !strings.Contains(err.Error(), `vm "kinds": attach disk "hx": device_add disk-hx:`) {
		t.Fatalf("attach with a clashing boot index: %v", err)
	}
	t.Logf("failed attach: %v", err)
	nodes, _ = sup.QMP(ctx, "kinds", []byte(`{"execute":"query-named-block-nodes","arguments":{"flat":true}}`), false)
	if strings.Contains(string(nodes), `-hx"`) {
		t.Errorf("half-added nodes after a failed attach: %s", nodes)
	}
	if _, err := os.Stat(hx.File); !os.IsNotExist(err) {
		t.Errorf("image of the failed attach left: %v", err)
	}
	if st, _ := sup.Status(ctx, "kinds"); len(st.AttachedDisks) != 0 {
		t.Errorf("failed attach recorded: %q", st.AttachedDisks)
	}

	// A guest that does not release the disk (paused: it cannot answer the
	// unplug request) gets a clear error; the disk stays attached, and a
	// later detach, once the guest let go, finishes.
	impatient, err := supervisor.New(supervisor.Options{Root: sup.Root(), SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps,
		JournalDir: env.Systemd.JournalDir, Self: vmsupBin, UnplugTimeout: 3 * time.Second, AllowPaths: env.AllowPaths, BlockDirs: env.BlockDirs})
	if err != nil {
		t.Fatal(err)
	}
	defer impatient.Close()
	hz, _ := spec.CheckDisk("test", spec.Disk{Name: "hz", File: filepath.Join(sup.Root(), "images", "hz.qcow2"), Size: 16 * spec.MiB, Serial: "hz"}, "kinds")
	if _, err := sup.AttachDisk(ctx, "kinds", *hz); err != nil {
		t.Fatal(err)
	}
	g.devOf("hz")
	if err := sup.Pause(ctx, "kinds"); err != nil {
		t.Fatal(err)
	}
	err = impatient.DetachDisk(ctx, "kinds", "hz")
	want := `vm "kinds": detach disk "hz": the guest did not release device disk-hz within 3s`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("detach from a paused guest: %v\nwant prefix %q", err, want)
	}
	t.Logf("detach from a paused guest: %v", err)
	if st, _ := sup.Status(ctx, "kinds"); !slices.Equal(st.AttachedDisks, []string{"hz"}) {
		t.Errorf("after a timed-out detach, status lists %q, want [hz]", st.AttachedDisks)
	}
	if err := sup.Resume(ctx, "kinds"); err != nil {
		t.Fatal(err)
	}
	if err := sup.DetachDisk(ctx, "kinds", "hz"); err != nil {
		t.Fatalf("detach after resume: %v", err)
	}
	if !g.gone("hz", 10*time.Second) {
		t.Error("guest still has hz")
	}
	nodes, _ = sup.QMP(ctx, "kinds", []byte(`{"execute":"query-named-block-nodes","arguments":{"flat":true}}`), false)
	if strings.Contains(string(nodes), `-hz"`) {
		t.Errorf("stale nodes of hz: %s", nodes)
	}
	return hqPattern
}

// checkNoSecrets: neither vmsup argv, nor QEMU's command line (ps), nor the
// unit's journal, nor the state files hold a secret; the copies QEMU reads
// are 0600.
func checkNoSecrets(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File, st supervisor.Status, secrets ...string) {
	argv, err := sup.Argv(f)
	if err != nil {
		t.Fatal(err)
	}
	pids := qemuPIDs(t, f.VM.Name)
	if len(pids) != 1 {
		t.Fatalf("QEMU pids %v", pids)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	journal, _ := env.Systemd.Journal(ctx, "vmsup-"+f.VM.Name+".service")
	state, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(st.StateDir)), "records", st.Name, "state.json"))
	for _, s := range secrets {
		for what, text := range map[string]string{"vmsup argv": strings.Join(argv, " "), "QEMU cmdline": string(cmdline),
			"journal": journal, "state.json": string(state)} {
			if strings.Contains(text, s) {
				t.Errorf("%s holds a secret", what)
			}
		}
	}
	if !strings.Contains(string(cmdline), `"qom-type":"secret"`) || !strings.Contains(string(cmdline), `"password-secret":"sec-chap"`) {
		t.Errorf("QEMU cmdline has no secret objects: %s", cmdline)
	}
	ents, err := os.ReadDir(filepath.Join(st.StateDir, "secrets"))
	if err != nil || len(ents) != 2 {
		t.Fatalf("secrets dir: %v %v", ents, err)
	}
	for _, e := range ents {
		info, _ := e.Info()
		if info.Mode().Perm() != 0o600 {
			t.Errorf("secret %s is %v", e.Name(), info.Mode())
		}
	}
}

// assertNothingStarted: no unit and no state directory for vm.
func assertNothingStarted(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, vm string) {
	t.Helper()
	if out, _ := env.Systemd.Systemctl(ctx, "list-units", "--all", "--no-legend", "vmsup-"+vm+".service"); strings.TrimSpace(string(out)) != "" {
		t.Errorf("unit of %s exists: %s", vm, out)
	}
	if _, err := os.Stat(filepath.Join(sup.Root(), "vms", vm)); !os.IsNotExist(err) {
		t.Errorf("state dir of %s exists: %v", vm, err)
	}
}
