package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// hostSecret is a root-only file on the image directory's file system
// (a hard link needs one), the file a hostile VM file wants a guest to
// reach.
func hostSecret(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("host secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// namedACLEntries are the named-user entries of path's ACL (getfacl): what
// a grant to a QEMU user leaves.
func namedACLEntries(t *testing.T, path string) []string {
	t.Helper()
	out, err := exec.Command("getfacl", "-cpn", path).CombinedOutput()
	if err != nil {
		t.Fatalf("getfacl %s: %v %s", path, err, out)
	}
	var named []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "user:") && !strings.HasPrefix(l, "user::") {
			named = append(named, l)
		}
	}
	return named
}

// countingListener is a TCP listener on a kernel-chosen port that counts
// the connections it accepts.
func countingListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), &n
}

func runQemuImg(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v %s", args, err, out)
	}
}

// hostileImages plants, in root's image directory, the images of issue
// 45's hostile run: a hard link to the secret, a hard link to an image
// store blob, a qcow2 whose data_file is the secret, one whose base is an
// NBD export (addr): file name -> (format, what the refusal says).
func hostileImages(t *testing.T, root, secret, addr string) map[string][2]string {
	t.Helper()
	images := filepath.Join(root, "images")
	blobs := filepath.Join(imagestore.Dir(root), "blobs")
	for _, d := range []string{images, blobs} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	at := func(n string) string { return filepath.Join(images, n) }
	if err := os.Link(secret, at("hard.raw")); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(blobs, "sha256-0123")
	runQemuImg(t, "create", "-q", "-f", "qcow2", blob, "16M")
	if err := os.Link(blob, at("blob.qcow2")); err != nil {
		t.Fatal(err)
	}
	runQemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+at("data.raw"), at("datafile.qcow2"), "1M")
	runQemuImg(t, "amend", "-f", "qcow2", "-o", "data_file="+secret, at("datafile.qcow2"))
	runQemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", "nbd://"+addr+"/x", "-F", "raw", at("nbd.qcow2"), "16M")
	return map[string][2]string{
		"hard.raw":       {"raw", "has more than one hard link"},
		"blob.qcow2":     {"qcow2", "has more than one hard link"},
		"datafile.qcow2": {"qcow2", "names an external data file"},
		"nbd.qcow2":      {"qcow2", `backing file "nbd://` + addr + `/x" is not a plain file path`},
	}
}

// TestCLIDiskObjectsRefused (issue 45): validate, up, disk attach (to a
// running VM) and import refuse a disk that is a hard link to a root-only
// file or to an image store blob, a qcow2 with an external data file and a
// qcow2 whose base is an NBD export: one line naming the VM, the disk and
// the file, exit 1; the NBD listener is never connected to and no ACL
// entry is left on the secret.
func TestCLIDiskObjectsRefused(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	secret := hostSecret(t)
	addr, accepted := countingListener(t)
	cases := hostileImages(t, root, secret, addr)
	oneLine := func(what string, r result, want ...string) {
		t.Helper()
		line := strings.TrimSuffix(r.stderr, "\n")
		ok := r.code != 0 && !strings.Contains(line, "\n")
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if !ok {
			t.Errorf("%s: exit %d, stderr %q; want non-zero and one line with %q", what, r.code, r.stderr, want)
			return
		}
		t.Logf("%s: %s", what, line)
	}
	i := 0
	for file, c := range cases {
		i++
		name := fmt.Sprintf("ob%d", i)
		img := filepath.Join(root, "images", file)
		vm := write(t, dir, name+".toml", guestTOML(name, "")+fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nformat = %q\n", img, c[0]))
		for _, verb := range []string{"validate", "up"} {
			t0 := time.Now()
			r := vmsup(t, root, "", verb, vm)
			oneLine(fmt.Sprintf("%s %s (%s)", verb, file, time.Since(t0).Round(time.Millisecond)), r,
				fmt.Sprintf(`vm %q: disk "data": `, name), img, c[1])
			if verb == "up" && r.code == 0 {
				vmsup(t, root, "", "kill", name)
			}
		}
	}

	att := write(t, dir, "objatt.toml", strings.Replace(guestTOML("objatt", ""), `"20s"`, `"1s"`, 1))
	if r := vmsup(t, root, "", "up", att); r.code != 0 {
		t.Fatalf("up objatt: %+v", r)
	}
	defer vmsup(t, root, "", "kill", "objatt")
	for file, c := range cases {
		img := filepath.Join(root, "images", file)
		r := vmsup(t, root, "", "disk", "attach", "objatt", "--file", img, "--format", c[0], "--name", "d"+strings.Split(file, ".")[0])
		oneLine("disk attach "+file, r, `vm "objatt"`, img, c[1])
	}
	if r := vmsup(t, root, "", "disk", "ls", "objatt"); strings.Contains(r.stdout, "hard") || strings.Contains(r.stdout, "datafile") {
		t.Errorf("a refused disk was attached: %s", r.stdout)
	}

	for file, c := range cases {
		xml := write(t, dir, "imp-"+file+".xml", fmt.Sprintf(`<domain type='kvm'><name>imp</name><memory unit='MiB'>256</memory>
<os><type arch='x86_64' machine='q35'>hvm</type><kernel>%s</kernel></os>
<devices>
<disk type='file' device='disk'><driver name='qemu' type='%s'/><source file='%s'/><target dev='vda' bus='virtio'/></disk>
</devices></domain>`, env.Guest.Kernel, c[0], filepath.Join(root, "images", file)))
		r := vmsup(t, root, "", "import", xml)
		if r.code != 0 || strings.Contains(r.stdout, "file = ") || !strings.Contains(r.stderr, "not carried over: devices/disk[0] (vda): source") ||
			!strings.Contains(r.stderr, c[1]) {
			t.Errorf("import of %s: %+v; want the disk not carried over, saying %q", file, r, c[1])
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the NBD listener accepted %d connections", n)
	}
	if named := namedACLEntries(t, secret); len(named) != 0 {
		t.Errorf("the secret has ACL entries: %v", named)
	}
}

// holders lists the processes that hold path's object open (any name).
func holders(t *testing.T, path string) []string {
	t.Helper()
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	var out []string
	for _, fd := range fds {
		var st unix.Stat_t
		if unix.Stat(fd, &st) == nil && st.Dev == want.Dev && st.Ino == want.Ino {
			comm, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(fd)), "comm"))
			out = append(out, fd+" ("+strings.TrimSpace(string(comm))+")")
		}
	}
	return out
}

// TestCLIDiskSwapRace (issue 45): a disk's name flipped, by a goroutine,
// between a good image and a symlink to a root-only secret, across 60 ups
// (each killed after): no up starts a QEMU holding the secret, and no ACL
// entry is left on the secret or on the good image afterwards.
func TestCLIDiskSwapRace(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	secret := hostSecret(t)
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	disk, swap := filepath.Join(images, "x.raw"), filepath.Join(images, "x.swap")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, swap); err != nil {
		t.Fatal(err)
	}
	vm := write(t, dir, "race.toml", strings.Replace(guestTOML("race", ""), `"20s"`, `"1s"`, 1)+
		fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nformat = \"raw\"\n", disk))
	stop := make(chan struct{})
	var flips atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, disk, unix.AT_FDCWD, swap, unix.RENAME_EXCHANGE); err == nil {
				flips.Add(1)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	const runs = 60
	ups, leaks := 0, 0
	t0 := time.Now()
	for i := 0; i < runs; i++ {
		r := vmsup(t, root, "", "up", vm)
		if r.code == 0 {
			ups++
			if h := holders(t, secret); len(h) > 0 {
				leaks++
				t.Errorf("up %d: the secret is held by %v", i, h)
			}
		}
		if k := vmsup(t, root, "", "kill", "race"); k.code != 0 && r.code == 0 {
			t.Fatalf("kill after up %d: %+v", i, k)
		}
	}
	close(stop)
	<-done
	t.Logf("%d ups of %d succeeded, %d held the secret, %d flips, in %s", ups, runs, leaks, flips.Load(), time.Since(t0).Round(time.Second))
	for _, p := range []string{secret, disk, swap} {
		if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			continue
		}
		if named := namedACLEntries(t, p); len(named) != 0 {
			t.Errorf("%s has ACL entries after kill: %v", p, named)
		}
	}
}

// copyTo copies src to dst (0644): a file of the test's own, one link.
func copyTo(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestCLIBootFileObjects (issue 45): a kernel or initrd that is a hard
// link to a root-only file is refused by validate and up, one line naming
// the key, and the secret is granted nothing; a VM boots from vmsup's
// copies in its state directory (QEMU's command line names them and no
// original), its kernel and initrd get no ACL entry and can be deleted
// while it runs, and `systemctl stop` still powers it off by ACPI with
// its stop hooks run (no 226/NAMESPACE).
func TestCLIBootFileObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	root, dir := t.TempDir(), t.TempDir()
	secret := hostSecret(t)
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	kernel, initrd, hard := filepath.Join(images, "vmlinux"), filepath.Join(images, "initrd"), filepath.Join(images, "hard")
	copyTo(t, env.Guest.Kernel, kernel)
	copyTo(t, env.Guest.Initrd, initrd)
	if err := os.Link(secret, hard); err != nil {
		t.Fatal(err)
	}
	bootTOML := func(name, k, i string) string {
		return strings.NewReplacer(fmt.Sprintf("kernel = %q", env.Guest.Kernel), fmt.Sprintf("kernel = %q", k),
			fmt.Sprintf("initrd = %q", env.Guest.Initrd), fmt.Sprintf("initrd = %q", i)).Replace(guestTOML(name, ""))
	}
	for _, c := range []struct{ name, field, kernel, initrd string }{
		{"bk", "boot.kernel", hard, initrd}, {"bi", "boot.initrd", kernel, hard}} {
		vm := write(t, dir, c.name+".toml", bootTOML(c.name, c.kernel, c.initrd))
		for _, verb := range []string{"validate", "up"} {
			r := vmsup(t, root, "", verb, vm)
			line := strings.TrimSuffix(r.stderr, "\n")
			if want := c.field + ": " + hard + " has more than one hard link (2)"; r.code == 0 || strings.Contains(line, "\n") || !strings.Contains(line, want) {
				t.Errorf("%s %s: exit %d, stderr %q; want one line with %q", verb, c.field, r.code, r.stderr, want)
			} else {
				t.Logf("%s %s: %s", verb, c.field, line)
			}
			if verb == "up" && r.code == 0 {
				vmsup(t, root, "", "kill", c.name)
			}
		}
	}
	supervisortest.NoACLs(t, "after the refusals", []string{secret})

	vm := write(t, dir, "boot.toml", bootTOML("boot", kernel, initrd))
	if r := vmsup(t, root, "", "up", vm); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "kill", "boot")
	waitFor(t, filepath.Join(root, "vms", "boot", "console.log"), "VMSUP-SHELL-READY", time.Minute)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", qemuPIDOf(t, root, "boot")))
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Split(string(b), "\x00")
	copies := filepath.Join(root, "vms", "boot", "boot")
	for opt, want := range map[string]string{"-kernel": filepath.Join(copies, "kernel"), "-initrd": filepath.Join(copies, "initrd")} {
		if i := slices.Index(argv, opt); i < 0 || i+1 >= len(argv) || argv[i+1] != want {
			t.Errorf("QEMU's %s is not %s: %q", opt, want, argv)
		}
	}
	for _, a := range argv {
		if strings.Contains(a, kernel) || strings.Contains(a, initrd) {
			t.Errorf("QEMU's command line names an original: %q", a)
		}
	}
	supervisortest.NoACLs(t, "while the VM runs", []string{kernel, initrd, images})
	for _, p := range []string{kernel, initrd} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	supervisortest.StopByUnit(t, ctx, env.Systemd, "boot")
}
