package qemuargs_test

import (
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/spec"
)

// Build turns a parsed spec into QEMU's argv: pure, no QEMU needed. The
// sockets are where vmsup puts them (Supervisor.Sockets).
func ExampleBuild() {
	f, err := spec.New("web", spec.VM{Name: "web", Memory: 512 * spec.MiB, Accel: spec.AccelTCG,
		Boot: spec.Boot{Kernel: "/srv/vmlinux", Cmdline: "console=ttyS0"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	dir := "/var/lib/vmsup/vms/web/"
	argv, err := qemuargs.Build(&f.VM, qemuargs.Options{Binary: "/usr/bin/qemu-system-x86_64", Accel: spec.AccelTCG, CPU: "max",
		QMPSocket: dir + "qmp.sock", EventSocket: dir + "events.sock", ConsoleSocket: dir + "console.sock", AgentSocket: dir + "qga.sock"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := 0; i < len(argv); i++ {
		switch argv[i] {
		case "-accel", "-cpu", "-m", "-kernel", "-append":
			fmt.Println(argv[i], argv[i+1])
		}
	}
	fmt.Println(strings.Contains(strings.Join(argv, " "), "path="+dir+"qmp.sock"))
	// Output:
	// -accel tcg,split-wx=on,tb-size=128
	// -cpu max
	// -m size=512M
	// -kernel /srv/vmlinux
	// -append console=ttyS0
	// true
}
