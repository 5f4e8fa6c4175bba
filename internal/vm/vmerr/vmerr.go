// Package vmerr is the one shape of an error about a VM that vmsup's
// commands return: `vm "NAME": what went wrong`, named once, with the VM's
// name for callers that suggest or branch on it (VMName).
package vmerr

import (
	"errors"
	"fmt"
	"strings"
)

// Error is an error about one VM.
type Error struct {
	VM  string
	Err error
}

func (e *Error) Error() string  { return fmt.Sprintf("vm %q: %v", e.VM, e.Err) }
func (e *Error) Unwrap() error  { return e.Err }
func (e *Error) VMName() string { return e.VM }

// Wrap gives err the VM's name, once: an error that already names the VM
// (anything with a VMName method saying name) is returned as it is.
func Wrap(name string, err error) error {
	if err == nil || Names(name, err) {
		return err
	}
	return &Error{VM: name, Err: err}
}

// Names reports whether err already names VM name (something in its chain
// has a VMName method saying name).
func Names(name string, err error) bool {
	var named interface{ VMName() string }
	return errors.As(err, &named) && named.VMName() == name
}

// In is err within operation op on the VM: `vm "NAME": op: ...`, where err
// may already name the VM: the name is not said twice.
func In(name, op string, err error) error {
	return &Error{VM: name, Err: &opError{op: op, msg: Unnamed(name, err), err: err}}
}

// Unnamed is err's text without its `vm "NAME": ` prefix.
func Unnamed(name string, err error) string {
	return strings.TrimPrefix(err.Error(), fmt.Sprintf("vm %q: ", name))
}

type opError struct {
	op, msg string
	err     error
}

func (e *opError) Error() string { return e.op + ": " + e.msg }
func (e *opError) Unwrap() error { return e.err }
