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
