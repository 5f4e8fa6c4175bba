package spec

import (
	"strings"
	"testing"
)

func TestHostDevParse(t *testing.T) {
	f, err := Parse("/etc/vmsup/web.toml", []byte(base+"[[hostdev]]\naddress='01:00.0'\n[[hostdev]]\naddress='0000:0A:1f.7'\nname='gpu'\nrom_bar=false\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := f.VM.HostDevs[0], f.VM.HostDevs[1]
	if a.Address != "0000:01:00.0" || a.Name != "pci-0000-01-00.0" || a.ROMBar != nil {
		t.Errorf("hostdev[0]: %+v", a)
	}
	if b.Address != "0000:0a:1f.7" || b.Name != "gpu" || b.ROMBar == nil || *b.ROMBar {
		t.Errorf("hostdev[1]: %+v", b)
	}
}

func TestHostDevErrors(t *testing.T) {
	for _, c := range []struct{ toml, want string }{
		{"[[hostdev]]\nname='x'\n", "hostdev[0].address: missing"},
		{"[[hostdev]]\naddress='01:00'\n", `hostdev[0].address: "01:00" is not a PCI address`},
		{"[[hostdev]]\naddress='01:20.0'\n", `hostdev[0].address: "01:20.0": slot 20 is beyond 1f`},
		{"[[hostdev]]\naddress='0000:01:00.8'\n", `hostdev[0].address: "0000:01:00.8" is not a PCI address`},
		{"[[hostdev]]\naddress='01:00.0'\n[[hostdev]]\naddress='0000:01:00.0'\nname='b'\n", "hostdev[1].address: 0000:01:00.0 is also hostdev[0]"},
		{"[[hostdev]]\naddress='01:00.0'\nname='g'\n[[hostdev]]\naddress='02:00.0'\nname='g'\n", `hostdev[1].name: duplicate hostdev name "g" (also hostdev[0])`},
		{"[[hostdev]]\naddress='01:00.0'\nname='a b'\n", `hostdev[0].name: name "a b" may only contain`},
		{"[[hostdev]]\naddress='01:00.0'\nbar=1\n", "bar"},
	} {
		_, err := Parse("/etc/vmsup/web.toml", []byte(base+c.toml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.toml, err, c.want)
		}
	}
}
