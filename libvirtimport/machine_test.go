package libvirtimport

import (
	"strings"
	"testing"
)

// TestMachineKept: libvirt's versioned machine type is the VM's (its guest
// keeps its hardware under a newer QEMU); a type vmsup does not take
// becomes its family's alias, with a line saying so.
func TestMachineKept(t *testing.T) {
	for _, c := range []struct{ in, want, line string }{
		{"pc-q35-6.2", "pc-q35-6.2", ""},
		{"pc-i440fx-7.2", "pc-i440fx-7.2", ""},
		{"q35", "q35", ""},
		{"pc", "pc", ""},
		{"pc-q35-rhel9.2.0", "q35", `os/type/@machine: "pc-q35-rhel9.2.0" is not a versioned type vmsup takes`},
		{"pc-1.0", "pc", `os/type/@machine: "pc-1.0" is not a versioned type vmsup takes`},
	} {
		xml := `<domain type='kvm'><name>m</name><memory unit='MiB'>256</memory>
<os><type arch='x86_64' machine='` + c.in + `'>hvm</type><kernel>/boot/vmlinuz</kernel></os></domain>`
		_, vm, lines := convertLoads(t, xml, Options{})
		if vm.Machine != c.want || c.line != "" && !strings.Contains(lines, c.line) || c.line == "" && strings.Contains(lines, "@machine") {
			t.Errorf("%s: machine %q, want %q; lines:\n%s", c.in, vm.Machine, c.want, lines)
		}
	}
}
