// Package vmstate is where vmsup keeps what it knows of each VM between
// commands, under one state root:
//
//	ROOT/vms/NAME      the VM's state directory, which the QEMU user owns while
//	                   the VM runs: QMP, event, console and agent sockets, the
//	                   console log, UEFI variables, the QMP lock
//	ROOT/vms/.NAME.lock  the VM's lock: state-changing commands take turns
//	ROOT/records/NAME  vmsup's own records, root only: the applied spec and
//	                   state.json (Applied), the network record, marks
//
// Everything vmsup decides from as root (the unit to stop, what to tear
// down) is read from the records, never from a file QEMU could rewrite. It
// also names a VM's systemd units and AppArmor profile.
//
// It knows nothing of how a VM is started or stopped.
package vmstore
