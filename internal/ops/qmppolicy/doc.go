// Package qmppolicy decides which raw QMP commands "vmsup qmp" passes to a
// VM's QEMU without --unsafe. It is an allow-list: a table (Rules) of the
// read-only queries and of the commands vmsup's own operations send, each
// with a checker for its arguments. Everything else is refused, and so is
// an allowed command whose arguments would take QEMU outside its
// confinement: a host listener, a connection out, a host path outside the
// VM's state directory (relative paths resolved against QEMU's real working
// directory, symlinks followed where they exist), a program, a file
// descriptor by number, or the guest's disk or memory served or sent
// outside QEMU. Nested forms are walked: a block node's children, "json:"
// pseudo-protocol filenames, a transaction's actions; block options are
// first brought to the nested form (dotted keys expanded), and an option
// an allowed driver does not have is refused. Decide also lists the files
// of the state directory a passed command has QEMU open, for the caller
// to open itself and pass as descriptors.
//
// A refusal is a *Refusal with a Class a caller can branch on. The package
// only reads: the state directory's symlinks, a qcow2 image's header, a
// memory path's file system. It does not log (the supervisor does), know
// vmsup's own QMP traffic (which never passes here), or vouch for what a
// command does inside the guest. Markdown renders the table as
// docs/qmp-policy.md, which a test keeps in step with it.
package qmppolicy
