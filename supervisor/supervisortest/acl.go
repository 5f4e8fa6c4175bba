package supervisortest

import (
	"os/exec"
	"regexp"
	"testing"
)

// NoACLs fails t for any named user entry in the ACLs of paths (the
// tests' files have none of their own: one is a grant left to a QEMU
// user).
func NoACLs(t testing.TB, when string, paths []string) {
	t.Helper()
	named := regexp.MustCompile(`(?m)^user:[^:]+:`)
	for _, p := range paths {
		out, err := exec.Command("getfacl", "-cpn", p).CombinedOutput()
		if err != nil {
			t.Fatalf("getfacl %s: %v %s", p, err, out)
		}
		if m := named.FindAllString(string(out), -1); len(m) > 0 {
			t.Errorf("%s: %s has ACL entries %q:\n%s", when, p, m, out)
		}
	}
}
