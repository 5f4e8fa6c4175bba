package confine

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/posixacl"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// TestSharedBaseGrant: two VMs share a read-only image below a private
// directory that QEMU opens by name (a SATA disk). The first grants access;
// when it goes down the second keeps it (the grant is handed over), and
// when the second goes down nothing is left. Their kernel is copied into
// each state directory (bootfiles.go): it is granted nothing.
func TestSharedBaseGrant(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := t.TempDir()
	imgs := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(imgs, 0o700); err != nil {
		t.Fatal(err)
	}
	kernel, base := filepath.Join(imgs, "vmlinux"), filepath.Join(imgs, "base.raw")
	os.WriteFile(kernel, []byte("k"), 0o600)
	os.WriteFile(base, nil, 0o600)
	needRoot(t)
	s := &Manager{Root: root, Self: "/bin/true", QEMUUser: SharedQEMUUser, AppArmorUnusable: "test"}
	st := vmstore.Store{Root: root}
	cs := map[string]*Record{}
	for _, name := range []string{"a", "b"} {
		f, err := spec.Parse("/t/"+name+".toml", []byte(fmt.Sprintf("name = %q\nmemory = \"64M\"\naccel = \"tcg\"\n[boot]\nkernel = %q\n"+
			"[[disk]]\nname = \"base\"\nfile = %q\nbus = \"sata\"\nread_only = true\n", name, kernel, base)))
		if err != nil {
			t.Fatal(err)
		}
		p := st.Paths(name)
		os.MkdirAll(p.Dir, 0o700)
		if cs[name], err = s.Confine(ctx, f, p, spec.AccelTCG); err != nil {
			t.Fatal(err)
		}
	}
	uid, gid := cs["a"].UID, cs["a"].GID
	if len(cs["a"].Grants) == 0 {
		t.Fatal("first VM granted nothing")
	}
	for _, g := range cs["b"].Grants {
		if g.Path == base || g.Path == imgs {
			t.Fatalf("second VM granted %s again", g.Path)
		}
	}
	for _, g := range append(cs["a"].Grants, cs["b"].Grants...) {
		if g.Path == kernel {
			t.Fatalf("the kernel was granted: %+v", g)
		}
	}
	if err := s.Teardown(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := posixacl.HasAccess(base, uid, gid, nil, 4); !ok {
		t.Fatal("b lost access to the shared image when a went down")
	}
	if ok, _ := posixacl.HasAccess(imgs, uid, gid, nil, 1); !ok {
		t.Fatal("b lost search on the shared directory when a went down")
	}
	if err := s.Teardown(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{kernel, base, imgs, root} {
		if _, err := unix.Getxattr(p, "system.posix_acl_access", make([]byte, 64)); err == nil {
			t.Errorf("%s keeps an ACL after both VMs went down", p)
		}
	}
}

// TestPerVMUsers: with QEMUUser "per-vm" two VMs run as two users; each
// gets its own ACL entries, so neither can open the other's disk.
func TestPerVMUsers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := t.TempDir()
	imgs := filepath.Join(t.TempDir(), "imgs")
	if err := os.Mkdir(imgs, 0o700); err != nil {
		t.Fatal(err)
	}
	kernel, base := filepath.Join(imgs, "vmlinux"), filepath.Join(imgs, "base.raw")
	os.WriteFile(kernel, []byte("k"), 0o600)
	os.WriteFile(base, nil, 0o600)
	needRoot(t)
	s := &Manager{Root: root, Self: "/bin/true", QEMUUser: PerVMUser, AppArmorUnusable: "test"}
	st := vmstore.Store{Root: root}
	cs := map[string]*Record{}
	for _, name := range []string{"pa", "pb"} {
		u := s.qemuUserName(name)
		if len(u) > 32 || !strings.HasPrefix(u, "vmsupq-") {
			t.Fatalf("per-VM user name %q", u)
		}
		if _, err := user.Lookup(u); err != nil { // created by this test: remove it after
			t.Cleanup(func() { exec.Command("userdel", u).Run() })
		}
		// A SATA disk QEMU opens by name (granted), a virtio one it gets
		// as a descriptor (internal/lifecycle/diskfds: granted nothing).
		disk, byFD := filepath.Join(imgs, name+".raw"), filepath.Join(imgs, name+"-fd.raw")
		os.WriteFile(disk, nil, 0o600)
		os.WriteFile(byFD, nil, 0o600)
		f, err := spec.Parse("/t/"+name+".toml", []byte(fmt.Sprintf("name = %q\nmemory = \"64M\"\naccel = \"tcg\"\n[boot]\nkernel = %q\n"+
			"[[disk]]\nname = \"d\"\nfile = %q\nbus = \"sata\"\n[[disk]]\nname = \"e\"\nfile = %q\n"+
			"[[disk]]\nname = \"base\"\nfile = %q\nbus = \"sata\"\nread_only = true\n", name, kernel, disk, byFD, base)))
		if err != nil {
			t.Fatal(err)
		}
		p := st.Paths(name)
		os.MkdirAll(p.Dir, 0o700)
		if cs[name], err = s.Confine(ctx, f, p, spec.AccelTCG); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Teardown(context.Background(), name) })
	}
	a, b := cs["pa"], cs["pb"]
	if a.UID == b.UID || a.UID == 0 || b.UID == 0 {
		t.Fatalf("uids %d and %d", a.UID, b.UID)
	}
	for _, c := range []struct {
		who  *Record
		disk string
		want bool
	}{{a, "pa.raw", true}, {a, "pb.raw", false}, {b, "pb.raw", true}, {b, "pa.raw", false}, {a, "pa-fd.raw", false}, {b, "pb-fd.raw", false}} {
		ok, err := posixacl.HasAccess(filepath.Join(imgs, c.disk), c.who.UID, c.who.GID, nil, 6)
		if err != nil || ok != c.want {
			t.Errorf("%s on %s: access %v (%v), want %v", c.who.User, c.disk, ok, err, c.want)
		}
	}
	if err := s.Teardown(ctx, "pa"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := posixacl.HasAccess(base, b.UID, b.GID, nil, 4); !ok {
		t.Error("pb lost its own grant on the shared image when pa went down")
	}
}

// needRoot skips where chown, ACLs on others' files and useradd are not
// allowed: these tests give a system user access to files, as vmsup does.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it chowns files and adds ACL entries for the QEMU user")
	}
}
