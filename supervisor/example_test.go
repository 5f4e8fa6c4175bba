package supervisor_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// A Go program embeds vmsup the way the CLI does: parse a spec, then ask the
// supervisor. Argv needs no systemd and no QEMU.
func ExampleSupervisor_Argv() {
	sup, err := supervisor.New(supervisor.Options{
		Root: "/var/lib/vmsup",
		Self: "/usr/bin/vmsup",
		Host: &supervisor.Host{MemTotal: 8 << 30, KVMUnusable: "no /dev/kvm"},
	})
	if err != nil {
		log.Fatal(err)
	}
	f, err := spec.Parse("/etc/vmsup/web.toml", []byte(`
name = "web"
memory = "1G"
cpus = 2
[boot]
kernel = "vmlinux"
cmdline = "console=ttyS0"
`))
	if err != nil {
		log.Fatal(err)
	}
	argv, err := sup.Argv(f)
	if err != nil {
		log.Fatal(err)
	}
	for _, a := range argv[:16] {
		fmt.Println(a)
	}
	fmt.Println(strings.Contains(strings.Join(argv, " "), "-kernel /etc/vmsup/vmlinux"))
	// Output:
	// /usr/bin/qemu-system-x86_64
	// -nodefaults
	// -no-user-config
	// -display
	// none
	// -name
	// guest=web,debug-threads=on
	// -msg
	// timestamp=on
	// -sandbox
	// on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny
	// -machine
	// q35
	// -accel
	// tcg,split-wx=on,tb-size=128
	// -cpu
	// true
}

// The whole life of a VM through the API (needs root, QEMU and systemd).
func ExampleSupervisor_Up() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sup, err := supervisor.New(supervisor.Options{Root: "/var/lib/vmsup"})
	if err != nil {
		log.Fatal(err)
	}
	defer sup.Close()
	f, err := spec.Load("/etc/vmsup/web.toml")
	if err != nil {
		log.Fatal(err) // web.toml:3:10: memory: negative size "-1G"
	}
	if _, err := sup.Up(ctx, f); err != nil {
		log.Fatal(err)
	}
	if err := sup.Pause(ctx, "web"); err != nil {
		log.Fatal(err)
	}
	st, _ := sup.Status(ctx, "web")
	fmt.Println(st.State) // paused
	_ = sup.Resume(ctx, "web")
	r, err := sup.Down(ctx, "web")
	fmt.Println(r.Step, err) // acpi <nil>
}
