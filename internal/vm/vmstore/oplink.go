package vmstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// An operation journaled on one VM may make another (a clone, journaled on
// its template): a link, ROOT/vms/.NAME.op-on naming the VM whose journal
// it is, lets the next command on the made VM settle that operation too
// (a status of a clone whose command died found nothing of its own to
// settle and left its QEMU paused).

func (s Store) opLinkFile(name string) string {
	return filepath.Join(s.Root, "vms", "."+name+".op-on")
}

// LinkOp notes that name's state is the business of the operation
// journaled on on.
func (s Store) LinkOp(name, on string) error {
	if err := os.MkdirAll(filepath.Join(s.Root, "vms"), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(s.opLinkFile(name), []byte(on+"\n"), 0o600)
}

// OpLink is the VM whose operation name's state is linked to ("": none).
func (s Store) OpLink(name string) string {
	b, _ := os.ReadFile(s.opLinkFile(name))
	return strings.TrimSpace(string(b))
}

// UnlinkOp removes name's link to on's operation (if it names on).
func (s Store) UnlinkOp(name, on string) error {
	if s.OpLink(name) != on {
		return nil
	}
	if err := os.Remove(s.opLinkFile(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
