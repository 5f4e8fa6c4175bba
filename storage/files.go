package storage

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/spec"
)

// FileUse is one host file QEMU opens for a disk, with how: "rwk" (read,
// write, lock) or "rk".
type FileUse struct {
	Path string
	Mode string
}

// DiskFiles lists the host files QEMU opens for disk d: an image file and
// its whole backing chain (bases only read), a block device or an ISO.
// Network disks open no host file but an RBD disk's ceph_conf, and a seed's ISO and disk secrets live
// in the VM's state directory. What confinement must grant.
func DiskFiles(ctx context.Context, d spec.Disk) ([]FileUse, error) {
	switch d.Type {
	case spec.DiskRBD:
		if d.CephConf != "" { // librados reads it inside QEMU
			return []FileUse{{Path: d.CephConf, Mode: "r"}}, nil
		}
		return nil, nil
	case spec.DiskISCSI, spec.DiskSeed:
		return nil, nil
	case spec.DiskBlock, spec.DiskISO:
		m := "rwk"
		if d.ReadOnly || d.Type == spec.DiskISO {
			m = "rk"
		}
		return []FileUse{{Path: d.File, Mode: m}}, nil
	}
	chain := []string{d.File}
	if d.Format == spec.FormatQcow2 {
		var err error
		if chain, err = backingChain(ctx, d.File, d.Format); err != nil {
			return nil, err
		}
	}
	var out []FileUse
	for j, file := range chain {
		m := "rwk"
		if d.ReadOnly || j > 0 { // bases of a chain are only read
			m = "rk"
		}
		out = append(out, FileUse{Path: file, Mode: m})
	}
	return out, nil
}

// backingChain returns the image and every file below it, top first,
// read from each file's own header (ReadHeader) so that nothing runs and
// nothing is connected to: a base that is not a plain file path, an
// external data file or a base without its format is refused. A relative
// backing name resolves against the image above, as QEMU takes it.
func backingChain(ctx context.Context, file, format string) ([]string, error) {
	var chain []string
	path := file
	for path != "" {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if len(chain) >= maxChain || slices.Contains(chain, path) {
			return nil, fmt.Errorf("backing chain of %s: %w", file, ErrChainLoop)
		}
		a, err := filepath.Abs(path)
		if err != nil {
			return nil, err
		}
		chain = append(chain, a)
		h, err := headerAt(a, format)
		if err != nil {
			return nil, fmt.Errorf("read backing chain of %s: %w", file, err)
		}
		if h.Backing == "" {
			break
		}
		if h.BackingFormat == "" {
			return nil, fmt.Errorf("read backing chain of %s: %s %w", file, a, ErrNoBackingFormat)
		}
		path, format = h.Backing, h.BackingFormat
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(a), path)
		}
	}
	return chain, nil
}

// headerAt reads the header of the file at path (no FIFO hang).
func headerAt(path, format string) (Header, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return Header{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Header{}, err
	}
	if !st.Mode().IsRegular() {
		return Header{}, fmt.Errorf("%s %w", path, ErrNotDiskObject)
	}
	return ReadHeader(f, format, st.Size())
}

// ImageID names the host object behind path, to find one image under two
// names: a block device by its device number (any /dev name of it), a
// file by its filesystem and inode (through symlinks, "..", hard links),
// and a file not there yet by its clean path with the directory's
// symlinks resolved.
func ImageID(path string) string {
	if path == "" {
		return ""
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return fmt.Sprintf("block device %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		return fmt.Sprintf("file %d:%d", st.Dev, st.Ino)
	}
	dir, base := filepath.Split(filepath.Clean(path))
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return "path " + filepath.Join(dir, base)
}
