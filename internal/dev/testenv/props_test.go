package testenv

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUnitPropertiesSets: a set-valued property printed in another order
// after a daemon-reload (IPAddressDeny failed TestReloadKeepsProperties
// 1 run in 6 that way) reads the same; a changed member, a deny list
// turned allow list, or an ordered list that changed order does not.
func TestUnitPropertiesSets(t *testing.T) {
	base := unitProperties("IPAddressDeny=0.0.0.0/0 ::/0\nSystemCallFilter=~@mount @clock kexec_load\nExecStart={ path=/bin/sleep ; argv[]=/bin/sleep 300 ; pid=12 ; code=(null) }\nDeviceAllow=/dev/null rw\nDeviceAllow=/dev/zero r\nEnvironment=A=b D=e\n")
	for _, c := range []struct {
		name, out string
		same      bool
	}{
		{"sets reordered, runtime fields changed", "IPAddressDeny=::/0 0.0.0.0/0\nSystemCallFilter=~kexec_load @clock @mount\nExecStart={ path=/bin/sleep ; argv[]=/bin/sleep 300 ; pid=99 ; code=exited }\nDeviceAllow=/dev/zero r\nDeviceAllow=/dev/null rw\nEnvironment=A=b D=e\n", true},
		{"a member changed", "IPAddressDeny=::/0 0.0.0.0/1\nSystemCallFilter=~kexec_load @clock @mount\nExecStart={ path=/bin/sleep ; argv[]=/bin/sleep 300 ; pid=12 ; code=(null) }\nDeviceAllow=/dev/null rw\nDeviceAllow=/dev/zero r\nEnvironment=A=b D=e\n", false},
		{"deny list became an allow list", "IPAddressDeny=0.0.0.0/0 ::/0\nSystemCallFilter=@mount @clock kexec_load\nExecStart={ path=/bin/sleep ; argv[]=/bin/sleep 300 ; pid=12 ; code=(null) }\nDeviceAllow=/dev/null rw\nDeviceAllow=/dev/zero r\nEnvironment=A=b D=e\n", false},
		{"an ordered list changed order", "IPAddressDeny=0.0.0.0/0 ::/0\nSystemCallFilter=~@mount @clock kexec_load\nExecStart={ path=/bin/sleep ; argv[]=/bin/sleep 300 ; pid=12 ; code=(null) }\nDeviceAllow=/dev/null rw\nDeviceAllow=/dev/zero r\nEnvironment=D=e A=b\n", false},
	} {
		d := cmp.Diff(base, unitProperties(c.out))
		if (d == "") != c.same {
			t.Errorf("%s: same=%v, want %v; diff:\n%s", c.name, d == "", c.same, d)
		}
	}
}
