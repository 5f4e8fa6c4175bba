package spec

import "testing"

// TestAllocMAC: a NIC's default MAC depends on the VM's and the NIC's
// names, not on how many NICs came before, and never repeats a taken one.
func TestAllocMAC(t *testing.T) {
	taken := map[string]bool{}
	inUse := func(m string) bool { return taken[m] }
	a := AllocMAC("vm", "a", inUse)
	taken[a] = true
	b := AllocMAC("vm", "b", inUse)
	taken[b] = true
	delete(taken, a) // a detached
	c := AllocMAC("vm", "c", inUse)
	if c == b || a == b {
		t.Fatalf("MACs collide: a %s b %s c %s", a, b, c)
	}
	if again := AllocMAC("vm", "a", inUse); again != a {
		t.Fatalf("the same NIC got another MAC: %s then %s", a, again)
	}
	// Its first candidate taken (by a NIC given that MAC by hand): the next.
	taken[a] = true
	if d := AllocMAC("vm", "a", inUse); d == a || validMAC(d) != nil {
		t.Fatalf("a taken MAC was handed out again: %s", d)
	}
}
