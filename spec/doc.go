// Package spec is vmsup's typed VM description: the one place that says what a
// VM is. It parses TOML files strictly (unknown keys are errors, every error
// names file:line:col and the field), fills documented defaults and checks the
// description for structural mistakes.
//
// spec does no host I/O beyond reading the file it is given: whether a kernel
// or disk image exists, whether KVM is usable or the host has enough memory is
// checked by the supervisor, which reports it through File.Errorf so those
// errors carry positions too. spec imports no other vmsup package; every other
// package may import it.
package spec
