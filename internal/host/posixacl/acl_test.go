package posixacl

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestACLGrantRevoke: a grant adds one named entry and revoking restores the
// file exactly: no ACL and the old mode, or the entry the user had before.
func TestACLGrantRevoke(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "img")
	if err := os.WriteFile(f, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	const uid = 4242
	if ok, _ := HasAccess(f, uid, uid, nil, 6); ok {
		t.Fatal("stranger has rw on a 0640 root file")
	}
	prev, err := GrantUser(f, uid, 6)
	if err != nil || prev != -1 {
		t.Fatalf("grant: prev %d %v", prev, err)
	}
	if ok, _ := HasAccess(f, uid, uid, nil, 6); !ok {
		t.Fatal("grant did not give rw")
	}
	if ok, _ := HasAccess(f, 4343, 4343, nil, 4); ok {
		t.Fatal("grant leaked to another user")
	}
	if err := RevokeUser(f, uid, prev); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(f)
	if _, err := unix.Getxattr(f, aclXattr, make([]byte, 64)); err == nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("after revoke: ACL err %v, mode %v", err, fi.Mode())
	}
	// The user already had r: the grant adds w, revoke leaves r.
	if _, err := GrantUser(f, uid, 4); err != nil {
		t.Fatal(err)
	}
	prev, err = GrantUser(f, uid, 2)
	if err != nil || prev != 4 {
		t.Fatalf("second grant: prev %d %v", prev, err)
	}
	if err := RevokeUser(f, uid, prev); err != nil {
		t.Fatal(err)
	}
	if ok, _ := HasAccess(f, uid, uid, nil, 4); !ok {
		t.Fatal("revoke took the user's own r")
	}
	if ok, _ := HasAccess(f, uid, uid, nil, 2); ok {
		t.Fatal("revoke left w")
	}
}

// TestACLGrantByObject: a grant through a descriptor lands on the object
// it is open on, even when the name was swapped (to a symlink to another
// file) in between, and is taken back from it the same way.
func TestACLGrantByObject(t *testing.T) {
	dir := t.TempDir()
	img, secret := filepath.Join(dir, "img"), filepath.Join(dir, "secret")
	for _, p := range []string{img, secret} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := os.Rename(img, img+".away"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, img); err != nil {
		t.Fatal(err)
	}
	const uid = 4242
	if prev, err := GrantUserFile(f, uid, 6); err != nil || prev != -1 {
		t.Fatalf("grant: prev %d %v", prev, err)
	}
	if e, _ := UserEntry(secret, uid); e != -1 {
		t.Fatalf("the secret got entry %o", e)
	}
	if e, _ := UserEntryFile(f, uid); e != 6 {
		t.Fatalf("the opened object's entry: %d", e)
	}
	if ok, _ := HasAccessFile(f, uid, uid, nil, 6); !ok {
		t.Fatal("no rw through the descriptor")
	}
	if err := RevokeUserFile(f, uid, -1); err != nil {
		t.Fatal(err)
	}
	if e, _ := UserEntry(img+".away", uid); e != -1 {
		t.Fatalf("entry left: %o", e)
	}
}
