package spec

import (
	"strings"
	"testing"
)

// One image can back only one disk: QEMU's write lock refuses the second
// at start. Read-only disks share an image (QEMU's read locks do).
func TestSharedImages(t *testing.T) {
	const head = "name = \"s\"\nmemory = \"256M\"\n[boot]\nkernel = \"/k\"\n"
	disk := func(name, extra string) string { return "[[disk]]\nname = \"" + name + "\"\n" + extra }
	for _, c := range []struct {
		name, disks, want string // want "" = valid
	}{
		{"same file", disk("root", "file = \"/x/a.qcow2\"\n") + disk("data", "file = \"/x/a.qcow2\"\n"),
			`s.toml:10:1: disk[1].file: /x/a.qcow2 is also disk "root"'s image (one image can back only one disk)`},
		{"same file through ..", disk("root", "file = \"/x/a.qcow2\"\n") + disk("data", "file = \"/x/y/../a.qcow2\"\n"),
			`s.toml:10:1: disk[1].file: /x/y/../a.qcow2 is also disk "root"'s image /x/a.qcow2 (one image can back only one disk)`},
		{"same block device", disk("a", "type = \"block\"\nfile = \"/dev/vg/lv\"\n") + disk("b", "type = \"block\"\nfile = \"/dev/vg/lv\"\n"),
			`s.toml:12:1: disk[1].file: /dev/vg/lv is also disk "a"'s image (one image can back only one disk)`},
		{"one of the two read-only", disk("root", "file = \"/x/a.raw\"\n") + disk("ro", "file = \"/x/a.raw\"\nread_only = true\n"),
			`s.toml:10:1: disk[1].file: /x/a.raw is also disk "root"'s image, which it writes (one image can back only one disk)`},
		{"backing is another disk's writable image", disk("base", "file = \"/x/base.qcow2\"\n") + disk("top", "file = \"/x/top.qcow2\"\nbacking = \"/x/base.qcow2\"\n"),
			`s.toml:11:1: disk[1].backing: /x/base.qcow2 is also disk "base"'s image, which it writes (one image can back only one disk)`},
		{"writable image is another disk's backing", disk("top", "file = \"/x/top.qcow2\"\nbacking = \"/x/base.qcow2\"\n") + disk("base", "file = \"/x/base.qcow2\"\n"),
			`s.toml:11:1: disk[1].file: /x/base.qcow2 is also disk "top"'s base image (one image can back only one disk)`},
		{"an ISO twice", disk("cd1", "type = \"iso\"\nfile = \"/x/d.iso\"\n") + disk("cd2", "type = \"iso\"\nfile = \"/x/d.iso\"\n"), ""},
		{"read-only twice", disk("a", "file = \"/x/a.raw\"\nread_only = true\n") + disk("b", "file = \"/x/a.raw\"\nread_only = true\n"), ""},
		{"two overlays on one base", disk("a", "file = \"/x/a.qcow2\"\nbacking = \"/x/base.qcow2\"\n") + disk("b", "file = \"/x/b.qcow2\"\nbacking = \"/x/base.qcow2\"\n"), ""},
		{"one iSCSI LUN, the port written or not", disk("a", "type = \"iscsi\"\nportal = \"192.0.2.1\"\ntarget = \"iqn.2026-01.x:t\"\nlun = 1\n") +
			disk("b", "type = \"iscsi\"\nportal = \"192.0.2.1:3260\"\ntarget = \"iqn.2026-01.x:t\"\nlun = 1\n"),
			`s.toml:15:1: disk[1].target: iscsi://192.0.2.1:3260/iqn.2026-01.x:t/1 is also disk "a"'s image (one image can back only one disk)`},
		{"one RBD image", disk("a", "type = \"rbd\"\npool = \"p\"\nimage = \"i\"\n") + disk("b", "type = \"rbd\"\npool = \"p\"\nimage = \"i\"\nread_only = true\n"),
			`s.toml:14:1: disk[1].image: rbd:p/i is also disk "a"'s image, which it writes (one image can back only one disk)`},
		{"two snapshots of one RBD image", disk("a", "type = \"rbd\"\npool = \"p\"\nimage = \"i\"\nsnapshot = \"s\"\n") +
			disk("b", "type = \"rbd\"\npool = \"p\"\nimage = \"i\"\nsnapshot = \"s\"\n"), ""},
		{"other LUNs of one target", disk("a", "type = \"iscsi\"\nportal = \"192.0.2.1\"\ntarget = \"iqn.2026-01.x:t\"\nlun = 1\n") +
			disk("b", "type = \"iscsi\"\nportal = \"192.0.2.1\"\ntarget = \"iqn.2026-01.x:t\"\nlun = 2\n"), ""},
		{"read-only base of an overlay", disk("base", "file = \"/x/base.qcow2\"\nread_only = true\n") + disk("top", "file = \"/x/top.qcow2\"\nbacking = \"/x/base.qcow2\"\n"), ""},
	} {
		_, err := Parse("s.toml", []byte(head+c.disks))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || err.Error() != c.want):
			t.Errorf("%s:\n got %v\nwant %s", c.name, err, c.want)
		}
	}
	// One block device used by three disks (a disk, a LUN, read-only):
	// each later one names the first.
	_, err := Parse("s.toml", []byte(head+disk("a", "type = \"block\"\nfile = \"/dev/vg/lv\"\n")+
		disk("b", "type = \"block\"\nfile = \"/dev/vg/lv\"\ndevice = \"lun\"\n")+disk("c", "type = \"block\"\nfile = \"/dev/vg/lv\"\nread_only = true\n")))
	if err == nil || strings.Count(err.Error(), `is also disk "a"'s image`) != 2 {
		t.Errorf("one block device, three disks: %v", err)
	}
	// Three disks on one image: each later one names the first.
	_, err = Parse("s.toml", []byte(head+disk("a", "file = \"/x/a.raw\"\n")+disk("b", "file = \"/x/a.raw\"\n")+disk("c", "file = \"/x/a.raw\"\n")))
	if err == nil || strings.Count(err.Error(), `is also disk "a"'s image`) != 2 {
		t.Errorf("three disks: %v", err)
	}
}
