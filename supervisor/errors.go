package supervisor

import (
	"errors"
	"fmt"
	"strings"
)

// vmError is an error about one VM in the one shape every public method
// returns: `vm "NAME": what went wrong`.
type vmError struct {
	vm  string
	err error
}

func (e *vmError) Error() string  { return fmt.Sprintf("vm %q: %v", e.vm, e.err) }
func (e *vmError) Unwrap() error  { return e.err }
func (e *vmError) VMName() string { return e.vm }

// vmErr gives err the VM's name, once: an error that already names the VM
// (a *StepError, *BusyError, *MigrateError or an earlier vmErr) is returned
// as it is.
func vmErr(name string, err error) error {
	if err == nil {
		return nil
	}
	var named interface{ VMName() string }
	if errors.As(err, &named) && named.VMName() == name {
		return err
	}
	return &vmError{vm: name, err: err}
}

// vmErrIn is err within operation op on the VM: `vm "NAME": op: ...`,
// where err may already name the VM (Restart's Down and Up): the name is
// not said twice.
func vmErrIn(name, op string, err error) error {
	return &vmError{vm: name, err: &opError{op: op, msg: unnamed(name, err), err: err}}
}

// unnamed is err's text without its `vm "NAME": ` prefix.
func unnamed(name string, err error) string {
	return strings.TrimPrefix(err.Error(), fmt.Sprintf("vm %q: ", name))
}

type opError struct {
	op, msg string
	err     error
}

func (e *opError) Error() string { return e.op + ": " + e.msg }
func (e *opError) Unwrap() error { return e.err }
