package confine

import (
	"context"
	"strings"
	"testing"
)

// TestUserNamePerRoot: the per-VM user of a VM depends on its state root
// too: two fleets' (or a test's and production's) VMs of one name never
// share a user. The name fits useradd's 32 bytes and the comment names
// root and VM.
func TestUserNamePerRoot(t *testing.T) {
	long := strings.Repeat("x", 64)
	for _, vm := range []string{"web", long} {
		a, b := UserName("/var/lib/vmsup", vm), UserName("/srv/test-fleet", vm)
		if a == b {
			t.Errorf("VM %q: one user %s for two roots", vm, a)
		}
		if a != UserName("/var/lib/vmsup/", vm) {
			t.Errorf("VM %q: the root's trailing slash changed its user", vm)
		}
		for _, u := range []string{a, b} {
			if len(u) > 32 || !strings.HasPrefix(u, "vmsupq-") {
				t.Errorf("user name %q", u)
			}
		}
	}
	if UserName("/r", "web") == UserName("/r", "web2") {
		t.Error("two VMs of one root share a user")
	}
	if c := UserComment("/var/lib/vmsup", "web"); c != "vmsup /var/lib/vmsup web" {
		t.Errorf("comment %q", c)
	}
	if c := UserComment("/a:b", "web"); c != "" {
		t.Errorf("comment of a root passwd cannot hold: %q", c)
	}
}

// TestIdentityKeepsRecordedUser: while a VM has a confinement record (its
// QEMU runs), Identity answers with the record's user, whatever name the
// VM would get now (a QEMU started by a vmsup that named users after the
// VM alone keeps its user for its hot-plugged taps and grants).
func TestIdentityKeepsRecordedUser(t *testing.T) {
	m := &Manager{Root: t.TempDir(), QEMUUser: PerVMUser}
	old := "vmsupq-0123456789" // as an older vmsup named it
	if err := m.writeConfinement("web", &Record{User: old, UID: 4242, GID: 4243}); err != nil {
		t.Fatal(err)
	}
	name, uid, gid, err := m.Identity(context.Background(), "web")
	if err != nil || name != old || uid != 4242 || gid != 4243 {
		t.Fatalf("Identity = %s %d %d %v, want the recorded %s 4242 4243", name, uid, gid, err, old)
	}
	if now := m.qemuUserName("web"); now == old || now != UserName(m.Root, "web") {
		t.Fatalf("a new start's user %s", now)
	}
}
