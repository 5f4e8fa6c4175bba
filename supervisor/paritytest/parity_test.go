package paritytest

import (
	"context"
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
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// shared are this package's real iSCSI target and Ceph cluster.
var shared supervisortest.Targets

// targets are both, for a test that needs both.
type targets struct {
	tgt  *testenv.TGT
	ceph *testenv.Ceph
	dir  string
	tid  func() int
}

func needTargets(t *testing.T) *targets {
	t.Helper()
	return &targets{tgt: shared.NeedTGT(t), ceph: shared.NeedCeph(t), dir: shared.Dir, tid: shared.NextTID}
}

// patterned makes a file of size bytes that starts with head.
func patterned(t *testing.T, path, head string, size int64) string {
	t.Helper()
	if err := testenv.MakeFile(path, size); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(head), 0); err != nil {
		t.Fatal(err)
	}
	return path
}

const (
	goodInitiator = "iqn.2026-01.test.vmsup:good"
	lunVendor     = "VMSUPTGT"
	lunProduct    = "PASSTHRU-LUN"
)

// setUpStorage makes the guest's remote disks: an iSCSI LUN behind an
// initiator-name ACL that answers INQUIRY with its own vendor and
// product, an RBD image whose snapshot and head differ, and an image in a
// RADOS namespace; and a client ceph.conf that says "auth none".
func setUpStorage(t *testing.T, ctx context.Context, tg *targets) (lunIQN, noneConf, keyFile string) {
	t.Helper()
	lunIQN = "iqn.2026-01.test.vmsup:passthru"
	lunFile := patterned(t, filepath.Join(tg.dir, "lun.img"), "VMSUP-LUN-PATTERN", 16<<20)
	if err := tg.tgt.AddTargetWith(ctx, tg.tid(), lunIQN, lunFile, testenv.TargetOptions{
		Initiators: []string{goodInitiator}, VendorID: lunVendor, ProductID: lunProduct}); err != nil {
		t.Fatal(err)
	}
	c := tg.ceph
	rbd := func(args ...string) {
		t.Helper()
		if out, err := c.RBD(ctx, args...); err != nil {
			t.Fatalf("%v %s", err, out)
		}
	}
	rbd("import", patterned(t, filepath.Join(tg.dir, "snap.img"), "SNAPSHOT-PATTERN", 16<<20), c.Pool+"/snapimg")
	rbd("snap", "create", c.Pool+"/snapimg@s1")
	// The head moves on after the snapshot.
	if out, err := exec.CommandContext(ctx, "qemu-io", "-c", "write -P 0x48 0 512", "--image-opts",
		"driver=raw,file.driver=rbd,file.pool="+c.Pool+",file.image=snapimg,file.conf="+c.Conf).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io write to the image's head: %v %s", err, out)
	}
	rbd("namespace", "create", c.Pool+"/ns1")
	rbd("import", patterned(t, filepath.Join(tg.dir, "ns.img"), "NAMESPACE-PATTERN", 16<<20), c.Pool+"/ns1/nsimg")

	client, err := os.ReadFile(c.ClientConf)
	if err != nil {
		t.Fatal(err)
	}
	noneConf = filepath.Join(tg.dir, "auth-none.conf")
	none := strings.Replace(string(client), "auth client required = cephx", "auth client required = none", 1)
	if none == string(client) {
		t.Fatalf("%s has no \"auth client required = cephx\" line to turn into none:\n%s", c.ClientConf, client)
	}
	keyFile = filepath.Join(tg.dir, "admin.key")
	if err := os.WriteFile(noneConf, []byte(none), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, []byte(c.AdminKey), 0o600); err != nil {
		t.Fatal(err)
	}
	return lunIQN, noneConf, keyFile
}

// guestDisk is one block device as the guest sees it.
type guestDisk struct{ name, serial, vendor, model, head string }

func guestDisks(t *testing.T, ctx context.Context, sh *testenv.GuestShell) []guestDisk {
	t.Helper()
	out, _, err := sh.Run(ctx, `for d in /sys/block/sd* /sys/block/vd*; do [ -e "$d" ] || continue; n=${d##*/}; `+
		`printf '%s|%s|%s|%s|' $n "$(cat $d/serial 2>/dev/null)" "$(cat $d/device/vendor 2>/dev/null)" "$(cat $d/device/model 2>/dev/null)"; `+
		`dd if=/dev/$n bs=32 count=1 2>/dev/null | tr -c 'A-Z-' '.'; echo; done`)
	if err != nil {
		t.Fatal(err)
	}
	var disks []guestDisk
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(strings.TrimSpace(line), "|")
		if len(f) != 5 {
			continue
		}
		disks = append(disks, guestDisk{f[0], strings.TrimSpace(f[1]), strings.TrimSpace(f[2]), strings.TrimSpace(f[3]), f[4]})
	}
	return disks
}

// TestLibvirtParity boots one guest with every libvirt-parity device a host
// like this one can give it and checks each from inside the guest; then,
// with the guest down, the iSCSI initiator names vmsup logs in with.
func TestLibvirtParity(t *testing.T) {
	ctx := supervisortest.Context(t, 10*time.Minute)
	tg := needTargets(t)
	lunIQN, noneConf, keyFile := setUpStorage(t, ctx, tg)
	dir := t.TempDir()
	scsiFile := patterned(t, filepath.Join(dir, "scsi.img"), "VMSUP-SCSI-PATTERN", 16<<20)
	credValue := fmt.Sprintf("cred-%d", time.Now().UnixNano())
	c := tg.ceph
	extra := fmt.Sprintf(`[smbios]
serial = "VMSUP-SER-7"

[credentials]
"vmsup.test" = %q

[[disk]]
name = "sd"
file = %q
bus = "scsi"

[[disk]]
name = "lun"
type = "iscsi"
portal = %q
target = %q
lun = 1
device = "lun"
initiator_name = %q

[[disk]]
name = "snap"
type = "rbd"
pool = %q
image = "snapimg"
snapshot = "s1"
ceph_conf = %q
user = "admin"
secret_file = %q
serial = "SNAP"

[[disk]]
name = "ns"
type = "rbd"
pool = %q
namespace = "ns1"
image = "nsimg"
ceph_conf = %q
user = "admin"
secret_file = %q
auth_client_required = ["cephx"]
serial = "NS"
`, credValue, scsiFile, tg.tgt.Portal, lunIQN, goodInitiator,
		c.Pool, c.ClientConf, keyFile, c.Pool, noneConf, keyFile)
	sup := supervisortest.New(t, env, "", vmsupBin)
	f := supervisortest.GuestFile(t, env, dir, "parity", extra)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	st, err := sup.Status(ctx, "parity")
	if err != nil {
		t.Fatal(err)
	}
	if st.UUID == "" || spec.ValidUUID(st.UUID) != nil {
		t.Fatalf("status: uuid %q: want the UUID generated at the first start", st.UUID)
	}
	sh := supervisortest.Shell(t, ctx, st)
	run := func(cmd string) string {
		t.Helper()
		out, code, err := sh.Run(ctx, cmd)
		if err != nil || code != 0 {
			t.Fatalf("guest: %s: exit %d, %v\n%s", cmd, code, err, out)
		}
		return strings.TrimSpace(out)
	}

	t.Run("smbios", func(t *testing.T) {
		if got := run("cat /sys/class/dmi/id/product_uuid"); got != st.UUID {
			t.Errorf("guest's product_uuid %q, want the recorded %q", got, st.UUID)
		}
		if got := run("cat /sys/class/dmi/id/product_serial"); got != "VMSUP-SER-7" {
			t.Errorf("guest's product_serial %q", got)
		}
		want := spec.CredentialPrefix + "vmsup.test=" + credValue
		if got := run("strings /sys/firmware/dmi/tables/DMI | grep -F credential"); !strings.Contains(got, want) {
			t.Errorf("guest's SMBIOS OEM strings %q lack %q", got, want)
		}
	})
	t.Run("rng", func(t *testing.T) {
		if got := run("cat /sys/devices/virtual/misc/hw_random/rng_current"); !strings.HasPrefix(got, "virtio_rng") {
			t.Errorf("rng_current %q, want virtio_rng.N", got)
		}
	})
	disks := guestDisks(t, ctx, sh)
	t.Logf("guest disks: %+v", disks)
	find := func(ok func(guestDisk) bool) (guestDisk, bool) {
		i := slices.IndexFunc(disks, ok)
		if i < 0 {
			return guestDisk{}, false
		}
		return disks[i], true
	}
	t.Run("scsi-disk", func(t *testing.T) {
		d, ok := find(func(d guestDisk) bool { return strings.HasPrefix(d.head, "VMSUP-SCSI-PATTERN") })
		if !ok || !strings.HasPrefix(d.name, "sd") || d.model != "QEMU HARDDISK" {
			t.Errorf("the bus = \"scsi\" disk: got %+v, want an sdX QEMU HARDDISK reading the image's pattern", d)
		}
	})
	t.Run("lun-passthrough", func(t *testing.T) {
		d, ok := find(func(d guestDisk) bool { return strings.HasPrefix(d.head, "VMSUP-LUN-PATTERN") })
		if !ok || !strings.HasPrefix(d.name, "sd") || d.vendor != lunVendor || d.model != lunProduct {
			t.Errorf("the lun disk: got %+v, want an sdX with vendor %q model %q (the target's INQUIRY)", d, lunVendor, lunProduct)
		}
	})
	t.Run("rbd-snapshot", func(t *testing.T) {
		d, ok := find(func(d guestDisk) bool { return d.serial == "SNAP" })
		if !ok || !strings.HasPrefix(d.head, "SNAPSHOT-PATTERN") {
			t.Errorf("the snapshot disk: got %+v, want the snapshot's pattern (the head starts with H)", d)
		}
	})
	t.Run("rbd-namespace", func(t *testing.T) {
		d, ok := find(func(d guestDisk) bool { return d.serial == "NS" })
		if !ok || !strings.HasPrefix(d.head, "NAMESPACE-PATTERN") {
			t.Errorf("the namespaced disk (cephx forced over a ceph.conf saying none): got %+v", d)
		}
	})
	sh.Close()
	if _, err := sup.Down(ctx, "parity"); err != nil {
		t.Fatal(err)
	}
	initiators(t, ctx, sup, tg, dir, f, st.UUID, lunIQN)
	t.Run("auth-none-conf-without-override", func(t *testing.T) {
		// Without auth_client_required the ceph.conf's "none" wins, the
		// cephx key goes unused and the cluster refuses the open.
		extra := fmt.Sprintf("[[disk]]\nname = \"ns\"\ntype = \"rbd\"\npool = %q\nnamespace = \"ns1\"\nimage = \"nsimg\"\n"+
			"ceph_conf = %q\nuser = \"admin\"\nsecret_file = %q\n", c.Pool, noneConf, keyFile)
		if err := sup.Validate(supervisortest.GuestFile(t, env, dir, "noauth", extra)); err == nil {
			t.Error("an RBD disk whose ceph.conf says auth none opened without auth_client_required = [\"cephx\"]")
		}
	})
}

// initiators checks the names vmsup's QEMU and its storage probe log in
// with, against targets with initiator-name ACLs (real libiscsi logins).
func initiators(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, tg *targets, dir string, f *spec.File, uuid, lunIQN string) {
	t.Run("uuid-kept", func(t *testing.T) {
		argv, err := sup.Argv(f)
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.Index(argv, "-uuid"); i < 0 || argv[i+1] != uuid {
			t.Errorf("argv after down: want -uuid %s (the recorded one), got %q", uuid, argv)
		}
	})
	iscsiOnly := func(name, target, initiator string) *spec.File {
		extra := fmt.Sprintf("[[disk]]\nname = \"lun\"\ntype = \"iscsi\"\nportal = %q\ntarget = %q\nlun = 1\n", tg.tgt.Portal, target)
		if initiator != "" {
			extra += fmt.Sprintf("initiator_name = %q\n", initiator)
		}
		return supervisortest.GuestFile(t, env, dir, name, extra)
	}
	t.Run("acl-refuses-another-name", func(t *testing.T) {
		err := sup.Validate(iscsiOnly("parity", lunIQN, "iqn.2026-01.test.vmsup:other"))
		if err == nil || !strings.Contains(err.Error(), "disk[0]") {
			t.Errorf("validate with an initiator the ACL does not list: %v, want a refusal naming disk[0]", err)
		}
		if err := sup.Validate(iscsiOnly("parity", lunIQN, goodInitiator)); err != nil {
			t.Errorf("validate with the ACL's initiator: %v", err)
		}
	})
	t.Run("default-name-from-uuid", func(t *testing.T) {
		iqn := "iqn.2026-01.test.vmsup:byuuid"
		file := patterned(t, filepath.Join(tg.dir, "byuuid.img"), "X", 1<<20)
		if err := tg.tgt.AddTargetWith(ctx, tg.tid(), iqn, file, testenv.TargetOptions{
			Initiators: []string{spec.DefaultInitiatorPrefix + ":" + uuid}}); err != nil {
			t.Fatal(err)
		}
		// The VM's recorded UUID names its default initiator; a VM never
		// started has none yet, so its probe cannot pass this ACL.
		if err := sup.Validate(iscsiOnly("parity", iqn, "")); err != nil {
			t.Errorf("validate of VM parity (uuid %s) without initiator_name: %v", uuid, err)
		}
		if err := sup.Validate(iscsiOnly("stranger", iqn, "")); err == nil {
			t.Error("validate of a VM with another UUID passed an ACL bound to parity's default initiator")
		}
	})
}
