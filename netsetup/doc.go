// Package netsetup owns the host side of vmsup's NICs: persistent taps made
// with netlink (owner, MTU, MAC), attached to a Linux bridge or added as a
// port of an Open vSwitch bridge, and NICs wired by CNI network
// configurations in a network namespace vmsup makes for the VM.
//
// It talks to the kernel over netlink (vishvananda/netlink) and enters
// namespaces with containernetworking's pkg/ns; the only programs it runs
// are ovs-vsctl and CNI plugin binaries. ovs-vsctl, because the OVS
// database speaks its own JSON-RPC schema that ovs-vsctl is the stable,
// shipped client of: it turns "add this port unless it exists" into one
// transaction and waits until ovs-vswitchd applied it (--may-exist,
// --if-exists, the wait), which an OVSDB client library would have to
// re-implement. CNI plugins are executables by definition (libcni runs
// them).
//
// QEMU opens each tap by name (-netdev tap,ifname=...), not as a passed
// fd: systemd, not vmsup, starts QEMU, so vmsup has no fd to hand over at
// exec, and passing fds over QMP (getfd) would mean starting QEMU with -S
// and adding every boot NIC afterwards, out of the argv and its golden
// tests. Opening by name needs the tap in QEMU's network namespace and
// owned by QEMU's user, which is what Tap.Owner and the cni namespace give.
//
// Every function here is idempotent where it removes something (a missing
// tap, port or namespace is not an error), so teardown can run from Down,
// from the unit's ExecStopPost= hook and after a crash, in any order.
//
// It does not own QEMU arguments (qemuargs), VM state or the order of steps
// (supervisor).
package netsetup
