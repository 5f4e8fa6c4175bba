// Package units runs QEMU processes as transient systemd units over D-Bus and
// reads their state back. systemd is vmsup's process supervisor: a VM exists
// while its unit vmsup-NAME.service exists, so no vmsup daemon has to.
//
// units knows nothing about VMs or QEMU: it turns a Unit (argv, limits, stop
// hooks) into unit properties and reports unit state. The supervisor decides
// what goes into a Unit.
package units
