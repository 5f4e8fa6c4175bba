package storage

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/userfile"
	"github.com/vmsup/vmsup/spec"
)

// A disk's image and its backing chain, opened as vmsup checks them: each
// level beneath the allowed place it lies in (OpenBeneath), the opened
// object checked (CheckDiskObject, its owner), its header read from the
// descriptor. The descriptors are returned, not closed, so that they are
// what is granted (and later what QEMU is given), never a second open of
// the name.

// ErrForeignOwner is an image owned by a VM's QEMU user: a file a confined
// (and perhaps compromised) QEMU could have written, never one vmsup or an
// operator made.
var ErrForeignOwner = errors.New("is owned by a VM's QEMU user")

// ErrChainLoop is a backing chain that comes back to one of its images or
// is deeper than the bound.
var ErrChainLoop = errors.New("backing chain loops or is too deep")

// Placer returns the allowed place (a directory) path lies in, lexically:
// for a disk's own file (base false) or a base image (true). Its error
// says why path is refused.
type Placer func(path string, base bool) (string, error)

// OpenLimits bound what OpenDisk accepts; zero values take the defaults.
type OpenLimits struct {
	MaxDepth       int   // levels of a chain, the top included (default 64)
	MaxVirtualSize int64 // bytes (default 64 TiB)
}

// OpenedImage is one level of a disk's chain, open and checked.
type OpenedImage struct {
	File   *os.File
	Object Object
	Path   string // absolute, clean, as vmsup names it
	Place  string // the directory it was opened beneath
	Header Header
	Mode   string // "rwk" for a writable top, else "rk"
}

// OpenedDisk is a disk's image and its bases, top first.
type OpenedDisk struct {
	Levels []OpenedImage
}

// Close closes every descriptor.
func (o *OpenedDisk) Close() error {
	if o == nil {
		return nil
	}
	var errs []error
	for _, l := range o.Levels {
		errs = append(errs, l.File.Close())
	}
	return errors.Join(errs...)
}

// OpenDisk opens the image file of d (type file or iso) and every base its
// headers name, each beneath the place placer gives, and checks each: a
// regular file with one link (a block device passes as a top only), owned
// by root or the place's owner, its qcow2 header (no external data file,
// bases plain file paths with their format named, the size bounded).
// Nothing is connected to and no other program runs. The caller closes
// the result. A missing top is an error wrapping os.ErrNotExist.
func OpenDisk(d spec.Disk, placer Placer, lim OpenLimits) (*OpenedDisk, error) {
	lim = lim.orDefaults()
	format := d.Format
	if d.Type == spec.DiskISO || format == "" {
		format = spec.FormatRaw
	}
	flags := unix.O_RDONLY
	mode := "rk"
	if !d.ReadOnly && d.Type == spec.DiskFile {
		flags, mode = unix.O_RDWR, "rwk"
	}
	out := &OpenedDisk{}
	ok := false
	defer func() {
		if !ok {
			out.Close()
		}
	}()
	path, base := filepath.Clean(d.File), false
	for {
		if len(out.Levels) >= lim.MaxDepth {
			return nil, fmt.Errorf("%s: %w (more than %d levels)", d.File, ErrChainLoop, lim.MaxDepth)
		}
		lvl, err := openLevel(path, format, base, flags, placer, lim)
		if err != nil {
			return nil, levelErr(d.File, base, err)
		}
		lvl.Mode = mode
		for _, seen := range out.Levels {
			if seen.Object.Same(lvl.Object) {
				lvl.File.Close()
				return nil, fmt.Errorf("%s: %w (%s comes back)", d.File, ErrChainLoop, path)
			}
		}
		out.Levels = append(out.Levels, lvl)
		h := lvl.Header
		if h.Backing == "" {
			break
		}
		if h.BackingFormat != spec.FormatRaw && h.BackingFormat != spec.FormatQcow2 {
			if h.BackingFormat == "" {
				return nil, fmt.Errorf("%s %w: refused (rebase it with -F raw or -F qcow2)", path, ErrNoBackingFormat)
			}
			return nil, fmt.Errorf("%s: base format %q: vmsup opens raw and qcow2 bases only", path, h.BackingFormat)
		}
		next := h.Backing
		if !filepath.IsAbs(next) {
			next = filepath.Join(filepath.Dir(path), next) // as QEMU takes a relative base
		}
		path, format, base, flags, mode = filepath.Clean(next), h.BackingFormat, true, unix.O_RDONLY, "rk"
	}
	ok = true
	return out, nil
}

// levelErr words a level's refusal: a base's names the image above it all,
// an open's drops Go's "open" prefix (the path leads).
func levelErr(top string, base bool, err error) error {
	err = openErr(err, "disk images")
	if base {
		return fmt.Errorf("%s's base image %w", top, err)
	}
	return err
}

// openErr words an open's refusal of a file of a kind (what: "disk
// images"): Go's "open" prefix dropped (the path leads).
func openErr(err error, what string) error {
	var pe *os.PathError
	if errors.As(err, &pe) && pe.Op == "open" {
		err = &pathErr{pe}
		// Worded for the common case, a symlink at the name (the name
		// is only looked at again to say so).
		if fi, lerr := os.Lstat(pe.Path); errors.Is(err, ErrNotBeneath) && lerr == nil && fi.Mode()&os.ModeSymlink != 0 {
			err = fmt.Errorf("%s is a symlink: refused, %s are opened by their own name (name the file it leads to): %w", pe.Path, what, ErrNotBeneath)
		}
	}
	return err
}

// pathErr is an *os.PathError worded "PATH: CAUSE" (errors.Is still sees
// the cause).
type pathErr struct{ *os.PathError }

func (e *pathErr) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *pathErr) Unwrap() error { return e.PathError }

// notDiskErr words ErrNotDiskObject by what the object is.
type notDiskErr struct{ msg string }

func (e *notDiskErr) Error() string { return e.msg }
func (e *notDiskErr) Unwrap() error { return ErrNotDiskObject }

// openLevel opens and checks one image of a chain.
func openLevel(path, format string, base bool, flags int, placer Placer, lim OpenLimits) (OpenedImage, error) {
	place, err := placer(path, base)
	if err != nil {
		return OpenedImage{}, err
	}
	// O_NONBLOCK: a FIFO planted at the name must not hang the open.
	f, err := OpenBeneath(place, path, flags|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return OpenedImage{}, err
	}
	lvl, err := checkLevel(f, path, place, format, base, lim)
	if err != nil {
		f.Close()
		return OpenedImage{}, err
	}
	return lvl, nil
}

func checkLevel(f *os.File, path, place, format string, base bool, lim OpenLimits) (OpenedImage, error) {
	o, err := CheckDiskObject(f)
	if errors.Is(err, ErrNotDiskObject) {
		if fi, serr := f.Stat(); serr == nil { // say what it is, as the name checks did
			return OpenedImage{}, &notDiskErr{fmt.Sprintf("%s is %s, not an image file", path, userfile.Kind(fi.Mode()))}
		}
	}
	if err != nil {
		return OpenedImage{}, err
	}
	lvl := OpenedImage{File: f, Object: o, Path: path, Place: place}
	if o.Kind == ObjectBlock {
		if base {
			return lvl, fmt.Errorf("%s: a base image is a block device: refused", path)
		}
		lvl.Header = Header{Format: format}
		return lvl, nil
	}
	if err := checkOwner(o, place, path); err != nil {
		return lvl, err
	}
	if lvl.Header, err = ReadHeader(f, format, o.Size); err != nil {
		return lvl, err
	}
	if lvl.Header.VirtualSize > lim.MaxVirtualSize {
		return lvl, fmt.Errorf("%s: %w (%s, more than %s)", path, ErrTooLarge, spec.Size(lvl.Header.VirtualSize), spec.Size(lim.MaxVirtualSize))
	}
	return lvl, nil
}

// checkOwner refuses an image owned by a VM's QEMU user (vmsupq-*, or the
// shared vmsup-qemu): vmsup creates images as root, so such a file was
// written by a QEMU. Any other owner is the host's: root, an operator, or
// libvirt's libvirt-qemu for an image carried over from libvirt (whose DAC
// gives images to it). place is unused beyond the message.
func checkOwner(o Object, place, path string) error {
	if o.UID == 0 {
		return nil
	}
	u, err := user.LookupId(strconv.FormatUint(uint64(o.UID), 10))
	if err != nil || !(strings.HasPrefix(u.Username, "vmsupq-") || u.Username == "vmsup-qemu") {
		return nil
	}
	return fmt.Errorf("%s %w (%s): refused, a file a confined QEMU could have written (in %s)", path, ErrForeignOwner, u.Username, place)
}

func (l OpenLimits) orDefaults() OpenLimits {
	if l.MaxDepth <= 0 {
		l.MaxDepth = maxChain
	}
	if l.MaxVirtualSize <= 0 {
		l.MaxVirtualSize = defaultMaxVirtualGiB << 30
	}
	return l
}
