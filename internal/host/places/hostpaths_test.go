package places

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
)

// tree makes a host under a temporary directory: an image directory with
// images, symlinks out and a dangling one, a block device directory with a
// device node (mknod, as root) and a regular file, a configuration
// directory and an allowed one.
func tree(t *testing.T) (string, *Places, bool) {
	t.Helper()
	d := t.TempDir()
	for _, dir := range []string{"images/sub", "images/share", "dev/by-id", "etc", "allowed"} {
		if err := os.MkdirAll(filepath.Join(d, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"images/a.qcow2", "dev/by-id/notblock", "etc/key", "allowed/vmlinuz", "outside.raw"} {
		if err := os.WriteFile(filepath.Join(d, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"images/shadow.raw": "/etc/shadow",
		"images/etc":        "/etc",
		"images/dangling":   "/etc/cron.d/vmsup-hostpaths-test",
		"images/rel":        "../outside.raw",
		"images/inside":     "sub",
		"dev/by-id/disk0":   "../blk0",
		"dev/by-id/shadow":  "/etc/shadow",
	} {
		if err := os.Symlink(target, filepath.Join(d, link)); err != nil {
			t.Fatal(err)
		}
	}
	blk := syscall.Mknod(filepath.Join(d, "dev/blk0"), syscall.S_IFBLK|0o600, 7<<8) == nil // a loop device's numbers
	return d, &Places{
		ImageDirs:  []string{filepath.Join(d, "images")},
		BlockDirs:  []string{filepath.Join(d, "dev/by-id")},
		ConfigDirs: []string{filepath.Join(d, "etc")},
		AllowPaths: []string{filepath.Join(d, "allowed")},
	}, blk
}

// TestCheck: each field's places, after symlinks and "..", and the
// refusal's words.
func TestCheck(t *testing.T) {
	d, p, blk := tree(t)
	img := func(s string) string { return filepath.Join(d, "images") + "/" + s }
	for _, c := range []struct {
		field, path string
		want        string // "" allowed; else in the error
		needsBlock  bool
	}{
		{"disk[0].file", img("a.qcow2"), "", false},
		{"disk[0].file", img("new.qcow2"), "", false}, // created on demand
		{"disk[0].file", img("sub/../a.qcow2"), "", false},
		{"disk[0].file", img("inside/../a.qcow2"), "", false},
		{"disk[0].file", "/etc/shadow", "/etc/shadow is outside the places VM files may name (image directories: " + filepath.Join(d, "images") +
			"; block device directories: " + filepath.Join(d, "dev/by-id") + "; allowed: " + filepath.Join(d, "allowed") +
			"): move it there, or allow its directory on this host (--image-dir, --block-dir or --allow-path DIR)", false},
		{"disk[0].file", img("shadow.raw"), img("shadow.raw") + " (leads to /etc/shadow) is outside the places", false},
		{"disk[0].file", img("../../../../../../../../etc/shadow"), "(leads to /etc/shadow) is outside", false},
		{"disk[0].file", img("etc/shadow"), "(leads to /etc/shadow) is outside", false},
		{"disk[0].file", img("dangling"), "(leads to /etc/cron.d/vmsup-hostpaths-test) is outside", false},
		{"disk[0].file", img("nothere/../../outside.raw"), "(leads to " + filepath.Join(d, "outside.raw") + ") is outside", false},
		{"disk[0].file", img("rel"), "(leads to " + filepath.Join(d, "outside.raw") + ") is outside", false},
		{"disk[0].backing", img("a.qcow2"), "", false},
		{"disk[0].backing", img("shadow.raw"), "outside the places", false},
		{"disk[0].file", filepath.Join(d, "dev/by-id/disk0"), "", true},
		{"disk[0].file", filepath.Join(d, "dev/by-id/missing"), "", false}, // the storage check says it is missing
		{"disk[0].file", filepath.Join(d, "dev/by-id/notblock"), "notblock is not a block device, and is outside", false},
		{"disk[0].file", filepath.Join(d, "dev/by-id/shadow"), "(leads to /etc/shadow) is not a block device, and is outside", false},
		{"disk[0].file", filepath.Join(d, "dev/by-id/../../outside.raw"), "outside the places", false},
		{"disk[0].file", filepath.Join(d, "dev/blk0"), "outside the places", true}, // not named through a block directory
		{"disk[0].backing", filepath.Join(d, "dev/by-id/disk0"), "outside the places", true},
		{"boot.kernel", filepath.Join(d, "allowed/vmlinuz"), "", false},
		{"boot.kernel", "/etc/shadow", "(image directories: " + filepath.Join(d, "images") + "; allowed: " + filepath.Join(d, "allowed") +
			"): move it there, or allow its directory on this host (--image-dir or --allow-path DIR)", false},
		{"boot.initrd", filepath.Join(d, "etc/key"), "outside the places", false}, // a secret is no initrd
		{"boot.vars_template", "/usr/share/OVMF/OVMF_VARS_4M.ms.fd", "", false},
		{"boot.vars_template", "/usr/share/OVMF/../../../etc/shadow", "firmware: /usr/share/OVMF", false},
		{"disk[1].user_data_file", "/etc/shadow", "outside the places", false},
		{"share[0].path", img("share"), "", false},
		{"share[0].path", "/", "outside the places", false},
		{"disk[2].secret_file", filepath.Join(d, "etc/key"), "", false},
		{"disk[2].secret_file", filepath.Join(d, "allowed/vmlinuz"), "", false},
		{"disk[2].secret_file", img("a.qcow2"), "(configuration directories: " + filepath.Join(d, "etc") + "; allowed: " +
			filepath.Join(d, "allowed") + "): move it there, or allow its directory on this host (--config-dir or --allow-path DIR)", false},
		{"disk[2].ceph_conf", "/etc/shadow", "outside the places", false},
		{"nic[0].cni_config", "/etc/shadow", "outside the places", false},
		{"file", "/etc/shadow", "block device directories", false}, // a disk given alone (disk attach)
	} {
		if c.needsBlock && !blk {
			t.Logf("%s = %s: skipped: no device node (mknod needs root)", c.field, c.path)
			continue
		}
		err := p.Check(c.field, c.path)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s = %s: %v, want allowed", c.field, c.path, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s = %s: %v, want an error with %q", c.field, c.path, err, c.want)
		case c.want != "" && !errors.Is(err, ErrOutside):
			t.Errorf("%s = %s: %v does not wrap ErrOutside", c.field, c.path, err)
		}
	}
}

// TestNonePlaces: no places at all refuses everything, and says so.
func TestNonePlaces(t *testing.T) {
	err := (&Places{}).Check("boot.kernel", "/boot/vmlinuz")
	if err == nil || !strings.Contains(err.Error(), "(none configured)") {
		t.Fatalf("got %v", err)
	}
}

// TestResolve: symlinks and ".." in order, a missing tail as written.
func TestResolve(t *testing.T) {
	d, _, _ := tree(t)
	for in, want := range map[string]string{
		d + "/images/a.qcow2":           d + "/images/a.qcow2",
		d + "/images/etc/shadow":        "/etc/shadow",
		d + "/images/etc/../x":          "/x", // the link first, then ".."
		d + "/images/inside/../a.qcow2": d + "/images/a.qcow2",
		d + "/images/new/dir/x.qcow2":   d + "/images/new/dir/x.qcow2",
		d + "/images/new/../../x.qcow2": d + "/x.qcow2",
		d + "/images/dangling":          "/etc/cron.d/vmsup-hostpaths-test",
		d + "/images/rel":               d + "/outside.raw",
		d + "//images/./sub/":           d + "/images/sub",
		"/":                             "/",
	} {
		got, err := Resolve(in)
		if err != nil || got != want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	loop := filepath.Join(d, "loop")
	if err := os.Symlink(loop, loop); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve(loop + "/x"); err == nil || !strings.Contains(err.Error(), "too many levels of symbolic links") {
		t.Errorf("a symlink loop: %v", err)
	}
}

// TestFields: every host path of a VM, by its key, in file order.
func TestFields(t *testing.T) {
	f, err := spec.Parse("/v/web.toml", []byte(`name = "web"
memory = "256M"
[boot]
kernel = "k"
initrd = "/i"
firmware = "uefi"
vars_template = "/t.fd"
[[disk]]
name = "root"
file = "root.qcow2"
backing = "/b.qcow2"
[[disk]]
name = "seed"
type = "seed"
user_data_file = "/u"
[[disk]]
name = "ceph"
type = "rbd"
pool = "p"
image = "i"
ceph_conf = "/etc/ceph/ceph.conf"
user = "admin"
secret_file = "/etc/ceph/key"
[[nic]]
name = "n"
type = "cni"
cni_config = "/etc/cni/net.d/n.conflist"
[[share]]
path = "/srv/share"
tag = "s"
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Field{{"boot.kernel", "/v/k"}, {"boot.initrd", "/i"}, {"boot.vars_template", "/t.fd"},
		{"disk[0].file", "/v/root.qcow2"}, {"disk[0].backing", "/b.qcow2"}, {"disk[1].user_data_file", "/u"},
		{"disk[2].ceph_conf", "/etc/ceph/ceph.conf"}, {"disk[2].secret_file", "/etc/ceph/key"},
		{"nic[0].cni_config", "/etc/cni/net.d/n.conflist"}, {"share[0].path", "/srv/share"}}
	if diff := cmp.Diff(want, Fields(&f.VM)); diff != "" {
		t.Errorf("Fields (-want +got):\n%s", diff)
	}
}

// The image store is an image place for a base (and any key but a disk's
// file), even under an image directory or an allowed path: a disk never
// opens a stored image as its writable file.
func TestStoreOnlyAsBase(t *testing.T) {
	d := t.TempDir()
	store := filepath.Join(d, "images", "image-store")
	if err := os.MkdirAll(filepath.Join(store, "sha256"), 0o755); err != nil {
		t.Fatal(err)
	}
	blob := filepath.Join(store, "sha256", "abc")
	if err := os.WriteFile(blob, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	p := &Places{ImageDirs: []string{filepath.Join(d, "images")}, AllowPaths: []string{d}, Store: store}
	if err := p.Check("backing", blob); err != nil {
		t.Errorf("a stored image as a base: %v", err)
	}
	if err := p.Check("disk[0].file", blob); err == nil || !strings.Contains(err.Error(), "image store") {
		t.Errorf("a stored image as a disk's file: %v, want it refused", err)
	}
	if err := (&Places{Store: store}).Check("disk[0].secret_file", blob); err == nil {
		t.Error("a stored image as a configuration file: allowed")
	}
}

// TestCheckFileBootObjects: CheckFile opens each boot file beneath its
// place as a start copies it (OpenFile) and refuses the object, one line
// at its key: a kernel that is a hard link to a root-only file, an initrd
// reached through a symlink inside the image directory; a missing one is
// left to the host check. A single allowed file opens beneath its own
// directory, a variable template from the distribution's firmware too.
func TestCheckFileBootObjects(t *testing.T) {
	d, p, _ := tree(t)
	secret := filepath.Join(t.TempDir(), "secret")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(secret, []byte("root only"), 0o600))
	must(os.Link(secret, filepath.Join(d, "images/hard")))
	must(os.Symlink("sub/initrd", filepath.Join(d, "images/initrd")))
	must(os.WriteFile(filepath.Join(d, "images/sub/initrd"), nil, 0o644))
	must(os.WriteFile(filepath.Join(d, "single"), nil, 0o644))
	p.AllowPaths = append(p.AllowPaths, filepath.Join(d, "single"))
	file := func(kernel, initrd string) *spec.File {
		f, err := spec.Parse(filepath.Join(d, "vm.toml"), []byte(`name = "b"
memory = "256M"
[boot]
kernel = "`+kernel+`"
initrd = "`+initrd+`"
`))
		must(err)
		return f
	}
	refused, err := p.CheckFile(t.Context(), file(filepath.Join(d, "images/hard"), filepath.Join(d, "images/initrd")))
	if diff := cmp.Diff([]string{"boot.kernel", "boot.initrd"}, refused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, want := range []string{"boot.kernel: " + filepath.Join(d, "images/hard") + " has more than one hard link (2)",
		"boot.initrd: " + filepath.Join(d, "images/initrd") + " is a symlink: refused"} {
		if !strings.Contains(msg, want) {
			t.Errorf("CheckFile: %q\nwant a line with %q", msg, want)
		}
	}
	if n := strings.Count(msg, "\n"); n != 1 {
		t.Errorf("CheckFile: %d lines, want 2:\n%s", n+1, msg)
	}
	if _, err := p.CheckFile(t.Context(), file(filepath.Join(d, "single"), filepath.Join(d, "images/missing"))); err != nil {
		t.Errorf("a single allowed kernel and a missing initrd: %v", err)
	}
	if _, err := os.Stat(FirmwareDir + "/OVMF_VARS_4M.fd"); err == nil {
		f, err := p.OpenFile("boot.vars_template", FirmwareDir+"/OVMF_VARS_4M.fd")
		if err != nil {
			t.Errorf("the distribution's variable template: %v", err)
		} else {
			f.Close()
		}
	}
}
