// Package supervisor is vmsup's lifecycle: it brings VMs described by spec
// files up and down as transient systemd units, and controls running ones
// over QMP. It is the only package that knows a VM's lifecycle and it only
// orchestrates: the state root, the host probe, confinement, the host side
// of NICs, QMP device plumbing and migration's machinery live in packages of
// their own (docs/architecture.md). The CLI in cmd/vmsup is a thin layer
// over this API, and other Go programs can embed it the same way:
//
//	sup, err := supervisor.New(supervisor.Options{Root: "/var/lib/vmsup"})
//	...
//	f, err := spec.Load("web.toml")
//	res, err := sup.Up(ctx, f)
//	st, err := sup.Status(ctx, "web")
//	_, err = sup.Down(ctx, "web")
//
// There is no vmsup daemon. The truth about a VM is its unit
// (vmsup-NAME.service) and, while that runs, QEMU's answer over QMP. vmsup
// keeps per VM only a state directory (Root/vms/NAME) and its records
// (Root/records/NAME). Every start goes through one pipeline of named steps
// (StartSteps), whatever starts it: up, restart, autostart or a migration
// destination.
package supervisor
