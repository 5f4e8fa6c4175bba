package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv/etcdtest"
)

// outsidePaths are the ways a VM file names the host's /etc/shadow: as
// it is, through a symlink planted in an image directory, and by ".." out
// of one.
func outsidePaths(t *testing.T, root string) []string {
	t.Helper()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(images, "shadow.raw")
	if err := os.Symlink("/etc/shadow", link); err != nil {
		t.Fatal(err)
	}
	return []string{"/etc/shadow", link, images + "/../../../../../../../../etc/shadow"}
}

// shadowACL is /etc/shadow's ACL, which a VM given it as a disk would
// change (its QEMU user's entry).
func shadowACL(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("getfacl", "-cp", "/etc/shadow").CombinedOutput()
	if err != nil {
		t.Fatalf("getfacl /etc/shadow: %v %s", err, out)
	}
	return string(out)
}

// TestCLIHostPathsRefused: validate, up and disk attach (to a VM shut off,
// which would only record it for the next up) refuse a VM file's path
// outside the host's places, naming the field and the places: one line,
// exit 1, nothing started, /etc/shadow untouched.
func TestCLIHostPathsRefused(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	acl := shadowACL(t)
	unitsBefore := vmsupUnits(t)
	paths := outsidePaths(t, root)
	// And an image whose qcow2 header names /etc/shadow as its base
	// (written by whoever could write the image: a guest, into a raw disk).
	evil := filepath.Join(root, "images", "evil.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", evil, "1M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v %s", err, out)
	}
	for i, p := range append(paths, evil) {
		name := fmt.Sprintf("hp%d", i)
		format := "raw"
		if p == evil {
			format = "qcow2"
		}
		file := write(t, dir, name+".toml", guestTOML(name, "")+fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nformat = %q\n", p, format))
		want := fmt.Sprintf("%s.toml:12:1: disk[0].file: %s", name, p)
		if p == evil { // refused when its chain is opened, naming the VM and disk
			want = fmt.Sprintf("%s.toml:12:1: disk[0].file: vm %q: disk \"data\": %s's base image /etc/shadow", name, name, p)
		}
		for _, verb := range []string{"validate", "up"} {
			r := vmsup(t, root, "", verb, file)
			line := strings.TrimSuffix(r.stderr, "\n")
			if r.code != 1 || strings.Contains(line, "\n") || !strings.Contains(line, want) ||
				!strings.Contains(line, "is outside the places VM files may name (image directories: "+filepath.Join(root, "images")) {
				t.Errorf("%s %s (disk file %s): %+v\nwant exit 1 and one line with %q ... is outside the places", verb, name, p, r, want)
			}
			if verb == "up" && r.code == 0 {
				vmsup(t, root, "", "down", "--force", name)
			}
		}
	}
	if got := vmsupUnits(t); got != unitsBefore {
		t.Errorf("units started by refused files:\nbefore %s\nafter  %s", unitsBefore, got)
	}

	// A VM that is shut off: attach only records the disk, which its next
	// up would boot with; the record must not take the path either.
	file := write(t, dir, "att.toml", guestTOML("att", ""))
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up att: %+v", r)
	}
	if r := vmsup(t, root, "", "down", "--force", "att"); r.code != 0 {
		t.Fatalf("down att: %+v", r)
	}
	block := write(t, dir, "block.toml", "name = \"blk\"\ntype = \"block\"\nfile = \"/etc/shadow\"\n")
	for i, args := range [][]string{
		{"--file", "/etc/shadow", "--format", "raw", "--name", "d0"},
		{"--file", filepath.Join(root, "images", "shadow.raw"), "--format", "raw", "--name", "d1"},
		{"--file", filepath.Join(root, "images") + "/../../../../../../../../etc/shadow", "--format", "raw", "--name", "d2"},
		{"--spec", block},
		{"--file", evil, "--name", "d4"},
	} {
		r := vmsup(t, root, "", append([]string{"disk", "attach", "att"}, args...)...)
		line := strings.TrimSuffix(r.stderr, "\n")
		if r.code != 1 || strings.Contains(line, "\n") || !strings.Contains(line, `vm "att": attach disk`) ||
			!strings.Contains(line, "is outside the places VM files may name (image directories: "+filepath.Join(root, "images")) {
			t.Errorf("disk attach %d %v: %+v\nwant exit 1 and one line: ... is outside the places VM files may name (...)", i, args, r)
		}
	}
	if r := vmsup(t, root, "", "disk", "ls", "att"); strings.Contains(r.stdout, "shadow") {
		t.Errorf("a refused disk was recorded: %+v", r)
	}
	if got := shadowACL(t); got != acl {
		t.Errorf("/etc/shadow's ACL changed:\nbefore %s\nafter  %s", acl, got)
	}
}

// TestCLIImportHostPaths: vmsup import does not copy a source outside the
// host's places into the VM file: the disk is listed as not carried over,
// with why ("..", symlinks resolved).
func TestCLIImportHostPaths(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	for i, p := range append(outsidePaths(t, root), "/var/lib/libvirt/images/../../../../etc/shadow") {
		xml := write(t, dir, fmt.Sprintf("imp%d.xml", i), fmt.Sprintf(`<domain type='kvm'><name>imp</name><memory unit='MiB'>256</memory>
<os><type arch='x86_64' machine='q35'>hvm</type><kernel>%s</kernel></os>
<devices>
<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='%s'/><target dev='vda' bus='virtio'/></disk>
</devices></domain>`, env.Guest.Kernel, p))
		r := vmsup(t, root, "", "import", xml)
		if r.code != 0 {
			t.Errorf("import of a disk %s: %+v", p, r)
			continue
		}
		for _, line := range strings.Split(r.stdout, "\n") {
			if strings.Contains(line, "shadow") && !strings.HasPrefix(line, "#") {
				t.Errorf("the VM file names a path outside the places: %q", line)
			}
		}
		want := "vmsup import: not carried over: devices/disk[0] (vda): source " + p
		if !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "is outside the places VM files may name") {
			t.Errorf("stderr does not list the disk as refused (%q ... is outside the places):\n%s", want, r.stderr)
		}
	}
}

// TestCLIFleetApplyHostPaths: fleet apply refuses a file naming a path
// outside the places, before anything is stored (all or none).
func TestCLIFleetApplyHostPaths(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	etcd, err := etcdtest.Start(context.Background(), t.TempDir(), etcdtest.Options{Members: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	ep := "--etcd=" + strings.Join(etcd.Endpoints(), ",")
	good := write(t, dir, "good.toml", guestTOML("good", ""))
	for i, p := range outsidePaths(t, root) {
		name := fmt.Sprintf("fl%d", i)
		file := write(t, dir, name+".toml", guestTOML(name, "")+fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nformat = \"raw\"\n", p))
		r := vmsup(t, root, "", "fleet", "apply", ep, good, file)
		line := strings.TrimSuffix(r.stderr, "\n")
		if r.code != 1 || strings.Contains(line, "\n") || !strings.Contains(line, fmt.Sprintf("%s.toml:12:1: disk[0].file: %s", name, p)) ||
			!strings.Contains(line, "is outside the places VM files may name") {
			t.Errorf("fleet apply %s (disk file %s): %+v\nwant exit 1 and one line naming disk[0].file", name, p, r)
		}
	}
	if r := vmsup(t, root, "", "fleet", "ls", ep); r.code != 0 || strings.Contains(r.stdout, "fl") || strings.Contains(r.stdout, "good") {
		t.Errorf("fleet ls after refused applies: %+v (nothing may be stored)", r)
	}
}
