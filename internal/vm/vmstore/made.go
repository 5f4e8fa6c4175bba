package vmstore

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// The disk images vmsup made for a VM (a disk's file created at its first
// start, an overlay on a stored image, a clone's overlays), one path a
// line in its records: rm --delete-disks deletes only these (and its
// snapshots' overlays), never a file the user made.

func (p Paths) madeFile() string { return filepath.Join(p.Records, "made-disks") }

// NoteMade adds paths to the VM's made images.
func (p Paths) NoteMade(paths ...string) error {
	if len(paths) == 0 {
		return nil
	}
	if err := p.MakeRecords(); err != nil {
		return err
	}
	made := p.Made()
	for _, x := range paths {
		if !slices.Contains(made, x) {
			made = append(made, x)
		}
	}
	return atomicfile.WriteFile(p.madeFile(), []byte(strings.Join(made, "\n")+"\n"), 0o600)
}

// Made lists the images vmsup made for the VM.
func (p Paths) Made() []string {
	b, _ := os.ReadFile(p.madeFile())
	return strings.Fields(string(b))
}
