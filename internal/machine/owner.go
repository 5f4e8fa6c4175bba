package machine

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/lifecycle/diskprep"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// A VM belongs to the file it was started from (Applied.SourceFile, the
// view's Owner): up, plan, apply and restart of another file that names the
// same VM are refused, since the VM's state (its disks attached by hand,
// snapshots, UEFI variables, TPM) is not that file's. The operator hands a
// VM to another file explicitly (Adopt), and the file becomes its owner
// when that command records it.

// ErrImageOwned is wrapped by a refusal of a VM file whose disk opens an
// image another VM owns (its disk writes it and is not marked shared).
var ErrImageOwned = diskprep.ErrOwned

// ErrOutsidePlaces is wrapped by a refusal of a VM file naming a host path
// outside the places VM files may name (internal/host/places).
var ErrOutsidePlaces = places.ErrOutside

// OwnerError says a file is not the one its VM belongs to.
type OwnerError struct {
	VM    string
	Owner string // the VM's file
	File  string // the file given
}

func (e *OwnerError) Error() string {
	return fmt.Sprintf("vm %q belongs to %s, not to %s (a VM is changed only from the file it was started from): "+
		"edit %s, or give --adopt to make %s its file", e.VM, e.Owner, e.File, e.Owner, e.File)
}

// VMName says which VM the error concerns.
func (e *OwnerError) VMName() string { return e.VM }

// CheckOwner refuses f when vmsup knows its VM and it belongs to another
// file, unless adopt.
func (s *Env) CheckOwner(f *spec.File, adopt bool) error {
	if adopt {
		return nil
	}
	app, err := s.state.ReadApplied(f.VM.Name)
	if errors.Is(err, os.ErrNotExist) {
		return nil // not known here: the file makes it
	}
	if err != nil {
		return vmerr.Wrap(f.VM.Name, err)
	}
	if app.SourceFile == "" || sameFileName(app.SourceFile, absPath(f.Path)) {
		return nil
	}
	return &OwnerError{VM: f.VM.Name, Owner: app.SourceFile, File: absPath(f.Path)}
}

// sameFileName reports whether two absolute paths name one file (equal,
// or the same inode through a symlink or a bind mount).
func sameFileName(a, b string) bool {
	if a == b {
		return true
	}
	return diskprep.SamePath(a, b)
}

// FileOf is the file VM name belongs to (its owner), for commands that
// take a VM's name where a file goes. ErrNotFound when vmsup does not know
// the VM.
func (s *Env) FileOf(name string) (string, error) {
	if err := spec.ValidName(name); err != nil {
		return "", vmerr.Wrap(name, err)
	}
	app, err := s.state.ReadApplied(name)
	if errors.Is(err, os.ErrNotExist) {
		return "", s.NotFound(name)
	}
	if err != nil {
		return "", vmerr.Wrap(name, err)
	}
	if app.SourceFile == "" {
		return "", vmerr.Wrap(name, errors.New("vmsup has no file for it (vmsup export writes one)"))
	}
	return app.SourceFile, nil
}

// Adopt records f as the file its (running or shut off) VM belongs to.
func (s *Env) Adopt(ctx context.Context, f *spec.File) error {
	name := f.VM.Name
	lk, err := s.Lock(ctx, name, "adopt")
	if err != nil {
		return err
	}
	defer lk.Unlock()
	app, err := s.state.ReadApplied(name)
	if err != nil {
		return vmerr.Wrap(name, err)
	}
	if app.SourceFile == absPath(f.Path) {
		return nil
	}
	app.SourceFile = absPath(f.Path)
	if err := s.state.RewriteApplied(app); err != nil {
		return vmerr.Wrap(name, fmt.Errorf("record %s as its file: %w", f.Path, err))
	}
	if marked, ok := s.state.Marked(); ok == nil && marked[name] != "" && marked[name] != s.Paths(name).Spec {
		// Enabled for boot from its old file: from its new one now.
		if _, err := s.state.Mark(name, app.SourceFile); err != nil {
			return vmerr.Wrap(name, fmt.Errorf("autostart mark: %w", err))
		}
	}
	return nil
}
