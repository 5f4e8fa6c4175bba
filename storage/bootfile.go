package storage

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/userfile"
)

// OpenFile opens a file a VM boots from that is not a disk (a kernel, an
// initrd, a UEFI variable template) beneath place, read-only, the way
// OpenDisk opens an image: no "..", symlink or magic link on the way
// (OpenBeneath), and the opened object a regular file with one link that no
// VM's QEMU user owns. vmsup copies the content from this descriptor into
// the VM's state directory and QEMU boots the copy, so a check of the name
// can never be undone by what the name leads to later. The caller closes
// the file.
func OpenFile(place, path string) (*os.File, Object, error) {
	// O_NONBLOCK: a FIFO planted at the name must not hang the open.
	f, err := OpenBeneath(place, path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, Object{}, openErr(err, "boot files")
	}
	o, err := checkFile(f, place, path)
	if err != nil {
		f.Close()
		return nil, o, err
	}
	return f, o, nil
}

// checkFile is OpenFile's check of the opened object.
func checkFile(f *os.File, place, path string) (Object, error) {
	o, err := CheckDiskObject(f)
	if err == nil && o.Kind != ObjectRegular {
		err = ErrNotDiskObject
	}
	if errors.Is(err, ErrNotDiskObject) {
		if fi, serr := f.Stat(); serr == nil { // say what it is
			return o, &notDiskErr{fmt.Sprintf("%s is %s, not a regular file", path, userfile.Kind(fi.Mode()))}
		}
	}
	if err != nil {
		return o, err
	}
	return o, checkOwner(o, place, path)
}
