package remotetest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoteImageOwnership: an operator limited to web* may not start a VM
// on the disk of another VM (shut off, so no QEMU lock stands in the way),
// neither as its disk nor as the base of a new overlay: refused in one line
// naming both VMs and the file, nothing granted on the image, and audited
// refused. A disk its VM marks shared may be opened by another VM.
func TestRemoteImageOwnership(t *testing.T) {
	h := startHost(t)
	images := filepath.Join(h.root, "images")
	if err := os.MkdirAll(images, 0o755); err != nil {
		t.Fatal(err)
	}
	private, shared := filepath.Join(images, "db.qcow2"), filepath.Join(images, "lib.qcow2")
	withDisk := func(name, disk string) string {
		return h.writeVM(t, name, guestTOML(name)+"\n[[disk]]\nname = \"data\"\n"+disk)
	}
	for name, disk := range map[string]string{
		"db":  fmt.Sprintf("file = %q\nsize = \"16M\"\n", private),
		"lib": fmt.Sprintf("file = %q\nsize = \"16M\"\nshared = true\n", shared),
	} {
		if r := h.local(t, "up", withDisk(name, disk)); r.code != 0 {
			t.Fatalf("local up %s: %+v", name, r)
		}
		if r := h.local(t, "down", "--force", name); r.code != 0 {
			t.Fatalf("local down %s: %+v", name, r)
		}
	}
	acl := func() []byte {
		b := make([]byte, 4096)
		n, err := unix.Getxattr(private, "system.posix_acl_access", b)
		if err != nil {
			return nil // no ACL at all
		}
		return b[:n]
	}
	before := acl()

	for _, c := range []struct{ vm, disk, want string }{
		{"web-steal2", fmt.Sprintf("file = %q\n", private), `disk[0].file: disk "data": ` + private + ` belongs to VM "db" (its disk "data"), not to VM "web-steal2"`},
		{"web-base", fmt.Sprintf("file = %q\nbacking = %q\n", filepath.Join(images, "web-base.qcow2"), private),
			`disk[0].backing: disk "data": ` + private + ` (as its base image) belongs to VM "db" (its disk "data"), not to VM "web-base"`},
	} {
		r := h.remote(t, "webop", "up", withDisk(c.vm, c.disk))
		if r.code != 1 || !strings.Contains(r.stderr, c.want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 {
			t.Errorf("remote up of %s on db's disk: %+v\nwant exit 1 and one line containing %q", c.vm, r, c.want)
		}
		sec := auditEntries(t, filepath.Join(h.root, "remote", "api-security.log"))
		if len(sec) == 0 || sec[len(sec)-1]["identity"] != "cn:webop" || sec[len(sec)-1]["verdict"] != "refused" ||
			!strings.Contains(fmt.Sprint(sec[len(sec)-1]["reason"]), `belongs to VM "db"`) {
			t.Errorf("security log after %s: %v", c.vm, sec)
		}
	}
	if after := acl(); !bytes.Equal(after, before) {
		t.Errorf("db's image ACL changed by the refused ups: %q -> %q", before, after)
	}
	if _, err := os.Stat(filepath.Join(images, "web-base.qcow2")); !os.IsNotExist(err) {
		t.Errorf("the refused overlay was made: %v", err)
	}

	// lib marks its disk shared: another VM may run on it.
	if r := h.remote(t, "webop", "up", withDisk("web-share", fmt.Sprintf("file = %q\n", shared))); r.code != 0 {
		t.Fatalf("remote up on a shared disk: %+v", r)
	}
	if r := h.remote(t, "webop", "down", "--force", "web-share"); r.code != 0 {
		t.Errorf("remote down: %+v", r)
	}
}
