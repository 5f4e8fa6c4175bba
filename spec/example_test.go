package spec_test

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// A VM built in Go gets the same defaults and checks as a file.
func ExampleNew() {
	f, err := spec.New("web", spec.VM{
		Name:   "web",
		Memory: 512 * spec.MiB,
		Boot:   spec.Boot{Kernel: "/srv/vmlinux", Cmdline: "console=ttyS0"},
		NICs:   []spec.NIC{{Name: "net0", Forwards: []string{"tcp:127.0.0.1:2222-:22"}}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(f.VM.CPUs, f.VM.Machine, f.VM.StopTimeout.D(), f.VM.NICs[0].Type, f.VM.NICs[0].MAC != "")
	// Output: 1 q35 1m0s user true
}

// Errors name the file, line, column and field, and every one is listed.
func ExampleParse_errors() {
	_, err := spec.Parse("web.toml", []byte(`name = "web"
memry = "1G"
[boot]
kernal = "/srv/vmlinux"
`))
	fmt.Println(err)
	// Output:
	// web.toml:2:1: memry: unknown key; did you mean "memory"?
	// web.toml:4:1: boot.kernal: unknown key; did you mean "kernel"?
}
