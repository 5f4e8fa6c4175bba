package confine

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/posixacl"
)

// TestRevokeFindsTheObject: a grant made through a descriptor is taken
// back from that object when its name has been swapped for a symlink to
// another file (the object found by its handle), and a name that now
// leads to another object is never revoked on.
func TestRevokeFindsTheObject(t *testing.T) {
	place := t.TempDir()
	img, other := filepath.Join(place, "x.raw"), filepath.Join(place, "other")
	for _, p := range []string{img, other} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := &Record{User: "test", UID: 4242, GID: 4242}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	g := aclGrant{Path: img, Perm: 6, Prev: -1}
	if g.Object, err = objectOf(f, place); err != nil {
		t.Fatal(err)
	}
	if g.Object.Handle == "" {
		t.Fatal("no file handle recorded")
	}
	if err := grantOne(g, f, c); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := unix.Renameat2(unix.AT_FDCWD, img, unix.AT_FDCWD, other, unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	// img now names the other file; the granted object is at other.
	if _, err := posixacl.GrantUser(img, c.UID, 4); err != nil { // an entry revoke must not touch
		t.Fatal(err)
	}
	if err := revokeObject(c, g); err != nil {
		t.Fatal(err)
	}
	if e, _ := posixacl.UserEntry(other, c.UID); e != -1 {
		t.Errorf("the granted object keeps entry %o", e)
	}
	if e, _ := posixacl.UserEntry(img, c.UID); e != 4 {
		t.Errorf("the file now at the name: entry %d, want 4 (not vmsup's grant)", e)
	}
	// By name only (no handle): the name leads to another object, left alone.
	g.Object.Handle = ""
	if f, _ := findObject(g); f != nil {
		f.Close()
		t.Error("found an object by a name that leads elsewhere")
	}
}
