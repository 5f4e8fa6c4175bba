// Package supervisor is vmsup's lifecycle: it brings VMs described by spec
// files up and down as transient systemd units, and controls running ones
// over QMP. It is the only package that knows a VM's lifecycle; the CLI in
// cmd/vmsup is a thin layer over this API, and other Go programs can embed it
// the same way:
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
// keeps per VM only a state directory (Root/vms/NAME, mode 0700) with the
// applied spec, the QMP/console/agent sockets and a lock file that makes
// state-changing commands on one VM take turns.
package supervisor
