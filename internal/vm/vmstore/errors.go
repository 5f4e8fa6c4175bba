package vmstore

import (
	"errors"
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

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

// NotVM refuses a name vmsup's own units have (spec.Reserved): the unit
// vmsup-NAME.service, if it runs, is not a VM's, and no command on a VM may
// touch it. It is ErrNotFound, so it exits and answers as an unknown VM.
func NotVM(name string) error {
	if err := spec.Reserved(name); err != nil {
		return fmt.Errorf("vm %q: %w: %v", name, ErrNotFound, err)
	}
	return nil
}
