package vmstate

import "errors"

// The errors every command on a VM may branch on, whichever package runs
// it (the supervisor's lifecycle, the feature families beside it): the
// supervisor exports them under the same names.
var (
	// ErrNotRunning means the VM is known but has no running QEMU to talk
	// to. A name vmsup does not know at all is ErrNotFound instead.
	ErrNotRunning = errors.New("not running")
	// ErrNotFound means vmsup knows no VM of that name.
	ErrNotFound = errors.New("no such VM")
)
