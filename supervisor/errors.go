package supervisor

import "github.com/vmsup/vmsup/internal/vmerr"

// vmErr gives err the VM's name, once (vmerr.Wrap): every public method
// returns errors about a VM in that one shape, `vm "NAME": ...`.
func vmErr(name string, err error) error { return vmerr.Wrap(name, err) }

// vmErrIn is err within operation op on the VM (vmerr.In).
func vmErrIn(name, op string, err error) error { return vmerr.In(name, op, err) }

// unnamed is err's text without its `vm "NAME": ` prefix.
func unnamed(name string, err error) string { return vmerr.Unnamed(name, err) }
