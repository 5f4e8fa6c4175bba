package qemuargs

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/spec"
)

// TestBootDisksMatchArgv: the disks left out under DisksByFD are exactly
// the ones the by-path command line renders, with the same ids, buses and
// addresses, so the guest sees one machine either way.
func TestBootDisksMatchArgv(t *testing.T) {
	for _, machine := range []string{"q35", "pc"} {
		f, err := spec.Parse("/t/vm.toml", []byte(`name = "fds"
machine = "`+machine+`"
accel = "tcg"
memory = "256M"
[[disk]]
name = "root"
file = "/img/root.qcow2"
boot_index = 1
[[disk]]
name = "cd"
type = "iso"
file = "/img/cd.iso"
[[disk]]
name = "inside"
file = "/run/fds/ov.qcow2"
`))
		if err != nil {
			t.Fatal(err)
		}
		o := Options{Binary: "/usr/bin/qemu-system-x86_64", Accel: spec.AccelTCG, QMPSocket: "/run/fds/q", EventSocket: "/run/fds/e",
			ConsoleSocket: "/run/fds/c", AgentSocket: "/run/fds/a", StateDir: "/run/fds"}
		byPath, err := Build(&f.VM, o)
		if err != nil {
			t.Fatal(err)
		}
		o.DisksByFD = true
		byFD, err := Build(&f.VM, o)
		if err != nil {
			t.Fatal(err)
		}
		bds, err := BootDisks(&f.VM, o)
		if err != nil {
			t.Fatal(err)
		}
		if len(bds) != 2 || bds[0].Disk.Name != "root" || bds[1].Disk.Name != "cd" {
			t.Fatalf("%s: BootDisks = %+v, want root and cd", machine, bds)
		}
		var plugged []string
		for _, bd := range bds {
			for _, r := range bd.Parts.renderers() {
				a, err := r.Args()
				if err != nil {
					t.Fatal(err)
				}
				plugged = append(plugged, a...)
			}
		}
		// By path = by descriptor's argv (without -S) + what is plugged, in order.
		var rest, fdArgs []string
		for i := 1; i < len(byPath); i += 2 {
			if !slices.Contains(plugged, byPath[i+1]) {
				rest = append(rest, byPath[i], byPath[i+1])
			}
		}
		if byPath[0] != byFD[0] || byFD[len(byFD)-1] != "-S" {
			t.Fatalf("%s: want the binary first and -S last: %q", machine, byFD)
		}
		fdArgs = byFD[1 : len(byFD)-1]
		if diff := cmp.Diff(rest, fdArgs); diff != "" {
			t.Errorf("%s: argv by path without the plugged disks differs from the argv by descriptor (-want +got):\n%s", machine, diff)
		}
		if slices.Contains(byPath, "-S") {
			t.Errorf("%s: -S by path: %q", machine, byPath)
		}
		for _, a := range byFD {
			if strings.Contains(a, "/img/") {
				t.Errorf("%s: argv by descriptor names %s", machine, a)
			}
		}
	}
}

func TestChainParts(t *testing.T) {
	d := spec.Disk{Name: "root", Type: spec.DiskFile, File: "/img/top.qcow2", Format: spec.FormatQcow2, Cache: "none", AIO: "threads"}
	p, err := Disk(d, DiskHost{}, "rp0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ChainParts(d, p, []ChainLevel{{"/dev/fdset/1", "qcow2", true}, {"/dev/fdset/2", "qcow2", true}, {"/dev/fdset/3", "raw", false}})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, b := range got.Blockdevs {
		a, err := b.Args()
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, a[1])
	}
	want := []string{
		`{"driver":"file","node-name":"b02froot","filename":"/dev/fdset/3","aio":"threads","cache":{"direct":true,"no-flush":false},"read-only":true}`,
		`{"driver":"raw","node-name":"b02-root","file":"b02froot","cache":{"direct":true,"no-flush":false},"read-only":true}`,
		`{"driver":"file","node-name":"b01froot","filename":"/dev/fdset/2","aio":"threads","cache":{"direct":true,"no-flush":false},"read-only":false}`,
		`{"driver":"qcow2","node-name":"b01-root","file":"b01froot","backing":"b02-root","cache":{"direct":true,"no-flush":false},"read-only":true}`,
		`{"driver":"file","node-name":"file-root","filename":"/dev/fdset/1","aio":"threads","cache":{"direct":true,"no-flush":false},"read-only":false}`,
		`{"driver":"qcow2","node-name":"fmt-root","file":"file-root","backing":"b01-root","cache":{"direct":true,"no-flush":false},"read-only":false}`,
	}
	if diff := cmp.Diff(want, lines); diff != "" {
		t.Errorf("ChainParts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(p.Devices, got.Devices); diff != "" {
		t.Errorf("devices changed:\n%s", diff)
	}
}
