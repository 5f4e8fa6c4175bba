package spec

import (
	"strings"
	"testing"
)

func TestDiskKindsParse(t *testing.T) {
	f, err := Parse("/etc/vmsup/k.toml", []byte(`name = "k"
memory = "256M"
[[disk]]
name = "root"
file = "vm.qcow2"
backing = "base.img"
[[disk]]
name = "cd"
type = "iso"
file = "x.iso"
[[disk]]
name = "seed"
type = "seed"
[[disk]]
name = "lun"
type = "iscsi"
portal = "192.0.2.1"
target = "iqn.2026-01.org.example:t"
user = "u"
secret_file = "chap"
[[disk]]
name = "vol"
type = "rbd"
pool = "rbd"
image = "img"
monitors = ["192.0.2.1:6789"]
`))
	if err != nil {
		t.Fatal(err)
	}
	d := f.VM.Disks
	if d[0].Type != DiskFile || d[0].Format != FormatQcow2 || d[0].Backing != "/etc/vmsup/base.img" {
		t.Errorf("overlay: %+v", d[0])
	}
	if !d[1].ReadOnly || d[1].Format != FormatRaw || !d[1].IsCDROM() {
		t.Errorf("iso: %+v", d[1])
	}
	if d[2].MetaData != "instance-id: k\nlocal-hostname: k\n" || !d[2].ReadOnly {
		t.Errorf("seed: %+v", d[2])
	}
	if d[3].Portal != "192.0.2.1:3260" || d[3].SecretFile != "/etc/vmsup/chap" || !d[3].NeedsSecret() {
		t.Errorf("iscsi: %+v", d[3])
	}
	if d[4].NeedsSecret() || d[4].Format != FormatRaw {
		t.Errorf("rbd: %+v", d[4])
	}
}

func TestDiskKindsErrors(t *testing.T) {
	for _, c := range []struct{ disk, want string }{
		{"type = \"floppy\"", `disk[0].type: unknown disk type "floppy"`},
		{"file = \"a.img\"\nportal = \"1.2.3.4\"", "disk[0].portal: applies only to disk type iscsi, not \"file\""},
		{"type = \"iscsi\"\ntarget = \"iqn.2026-01.x:y\"", "disk[0].portal: missing"},
		{"type = \"iscsi\"\nportal = \"h:99999\"\ntarget = \"iqn.2026-01.x:y\"", "disk[0].portal: \"h:99999\": bad port"},
		{"type = \"iscsi\"\nportal = \"h\"\ntarget = \"store\"", "disk[0].target: \"store\" is not an iSCSI name"},
		{"type = \"iscsi\"\nportal = \"h\"\ntarget = \"iqn.2026-01.x:y\"\nuser = \"u\"", "disk[0].secret_file: CHAP needs both user and secret_file"},
		{"type = \"rbd\"\nimage = \"i\"", "disk[0].pool: missing or invalid pool name"},
		{"type = \"rbd\"\npool = \"p\"\nimage = \"i\"\nsecret_file = \"k\"", "disk[0].user: a cephx key"},
		{"type = \"rbd\"\npool = \"p\"\nimage = \"i\"\nmonitors = [\"nohost\"]", "disk[0].monitors[0]: \"nohost\" is not HOST:PORT"},
		{"type = \"iso\"\nfile = \"a.iso\"\nformat = \"qcow2\"", "disk[0].format: a CD-ROM image is raw"},
		{"file = \"a.img\"\nformat = \"raw\"\nbacking = \"b.img\"", "disk[0].backing: an overlay needs format \"qcow2\""},
		{"type = \"seed\"\nuser_data = \"x\"\nuser_data_file = \"y\"", "disk[0].user_data_file: give user_data or user_data_file, not both"},
		{"type = \"iso\"\nfile = \"a.iso\"\niothread = true", "disk[0].iothread: applies only to disk type"},
		{"type = \"rbd\"\npool = \"p\"\nimage = \"i\"\naio = \"native\"\ncache = \"none\"", "disk[0].aio: applies only to file, block and iso"},
		{"file = \"a.img\"\nsize = \"1000\"", "disk[0].size: 1000 is not a multiple of 512 bytes"},
	} {
		_, err := Parse("/x/v.toml", []byte("name = \"v\"\nmemory = \"256M\"\n[[disk]]\nname = \"d\"\n"+c.disk+"\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("disk %q: error %v, want %q", c.disk, err, c.want)
		}
	}
}

func TestParseDisk(t *testing.T) {
	d, err := ParseDisk("/srv/d.toml", []byte("name = \"hot\"\ntype = \"iscsi\"\nportal = \"10.0.0.1\"\ntarget = \"iqn.2026-01.x:y\"\nlun = 2\n"), "web")
	if err != nil || d.Portal != "10.0.0.1:3260" || d.LUN != 2 || d.Format != FormatRaw || d.Cache != "writeback" {
		t.Fatalf("ParseDisk: %+v %v", d, err)
	}
	_, err = ParseDisk("/srv/d.toml", []byte("name = \"hot\"\ncolour = 1\n"), "web")
	if err == nil || !strings.HasPrefix(err.Error(), "/srv/d.toml:2:1: colour: unknown key") {
		t.Errorf("ParseDisk unknown key: %v", err)
	}
	_, err = ParseDisk("/srv/d.toml", []byte("name = \"hot\"\ntype = \"rbd\"\npool = \"p\"\n"), "web")
	if err == nil || !strings.HasPrefix(err.Error(), "/srv/d.toml:1:1: image: missing") {
		t.Errorf("ParseDisk bad rbd: %v", err)
	}
	d, err = CheckDisk("--file", Disk{Name: "x", File: "/a/b.qcow2"}, "web")
	if err != nil || d.Format != FormatQcow2 || d.Type != DiskFile {
		t.Errorf("CheckDisk: %+v %v", d, err)
	}
}
