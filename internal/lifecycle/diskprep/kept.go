package diskprep

// Which disk images a VM that vmsup rm forgets leaves on the host, and,
// when asked (rm --delete-disks), deleting the ones vmsup made for it:
// never a user's file, a shared or read-only one.

import (
	"errors"
	"os"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Kept is what rm did with a VM's disk images.
type Kept struct {
	Kept    []string `json:"kept,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
}

// PlanRemove sorts the existing images of v's file disks (with its snapshots'
// overlays) into those to keep and those to delete: with del, the ones
// vmsup made (its records' list, or its snapshots'), not shared or
// read-only.
func PlanRemove(v *vmstore.View, p vmstore.Paths, del bool) (keep, remove []string) {
	if v == nil {
		return nil, nil
	}
	ours := p.Made()
	if v.Tree != nil {
		ours = append(ours, v.Tree.Files()...)
	}
	for _, d := range v.Disks {
		if d.Type != spec.DiskFile {
			continue
		}
		for _, f := range d.Images(v.Tree) {
			if _, err := os.Stat(f); err != nil || slices.Contains(keep, f) || slices.Contains(remove, f) ||
				strings.HasPrefix(f, p.Records) {
				continue
			}
			if del && !d.Shared && !d.ReadOnly && slices.Contains(ours, f) {
				remove = append(remove, f)
			} else {
				keep = append(keep, f)
			}
		}
	}
	return keep, remove
}

// DeleteImages removes files, returning those it removed.
func DeleteImages(files []string) ([]string, error) {
	var done []string
	var errs []error
	for _, f := range files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		done = append(done, f)
	}
	return done, errors.Join(errs...)
}
