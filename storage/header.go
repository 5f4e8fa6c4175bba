package storage

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/vmsup/vmsup/spec"
)

// qcow2 header fields vmsup reads itself (QEMU's docs/interop/qcow2.txt):
// big-endian, extensions after the header as type, length, data padded to
// 8 bytes, up to a zero type.
const (
	qcow2Magic        = 0x514649fb // "QFI\xfb"
	qcow2ExtEnd       = 0
	qcow2ExtBackingFo = 0xe2792aca // the backing file's format name
	qcow2V2HeaderLen  = 72
	// Incompatible feature bits that change nothing of what Info says:
	// dirty (0), compression type (3), extended L2 entries (4). Any other
	// (corrupt, an external data file QEMU would open too, one newer than
	// this code) leaves the image to qemu-img.
	qcow2KnownIncompat = 1<<0 | 1<<3 | 1<<4
	// headerRead bounds what is read: header, extensions and the backing
	// name all sit in the first cluster (at least 512 bytes, at most 2 MiB,
	// QEMU keeps them within 64 KiB in practice).
	headerRead = 64 << 10
)

// localInfo is Info for a local image file of a declared format vmsup can
// read itself: raw, or qcow2 (version 2 or 3, unencrypted, its backing
// file local and its format named). ok is false for anything else, and
// qemu-img is asked instead. It spares a qemu-img process per disk and
// level at each start (~9 ms of a VM's start, measured). Like qemu-img
// info without -U it refuses an image another process writes.
func localInfo(path, format string) (info ImageInfo, ok bool, err error) {
	if format != spec.FormatRaw && format != spec.FormatQcow2 {
		return ImageInfo{}, false, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return ImageInfo{}, false, nil // qemu-img words it
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return ImageInfo{}, false, nil
	}
	if locked, err := BeingWritten(path); err != nil || locked {
		if locked {
			err = fmt.Errorf("%w (QEMU image lock): %s is open for writing by another process", ErrInUse, path)
		}
		return ImageInfo{}, err != nil, err
	}
	// QEMU's raw driver rounds the length up to whole 512-byte sectors.
	info = ImageInfo{Filename: path, Format: format, VirtualSize: (st.Size() + 511) &^ 511, ActualSize: allocated(st)}
	if format == spec.FormatRaw {
		return info, true, nil
	}
	buf := make([]byte, headerRead)
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.ErrUnexpectedEOF {
		return ImageInfo{}, false, nil
	}
	return qcow2Header(info, buf[:n])
}

// qcow2Header fills info from a qcow2 header in buf; ok false when the
// header is not one localInfo reads.
func qcow2Header(info ImageInfo, buf []byte) (ImageInfo, bool, error) {
	be := binary.BigEndian
	if len(buf) < qcow2V2HeaderLen || be.Uint32(buf) != qcow2Magic {
		return info, false, nil
	}
	version := be.Uint32(buf[4:])
	if (version != 2 && version != 3) || be.Uint32(buf[32:]) != 0 { // crypt_method
		return info, false, nil
	}
	if cb := be.Uint32(buf[20:]); cb < 9 || cb > 21 {
		return info, false, nil // not a valid header: qemu-img says why
	}
	info.VirtualSize = int64(be.Uint64(buf[24:]))
	extAt := uint64(qcow2V2HeaderLen)
	if version == 3 {
		if len(buf) >= 104 && be.Uint64(buf[72:])&qcow2IncompatData != 0 {
			return info, true, fmt.Errorf("%s %w: refused, QEMU would open it unchecked", info.Filename, ErrExternalDataFile)
		}
		if len(buf) < 104 || be.Uint64(buf[72:])&^qcow2KnownIncompat != 0 {
			return info, false, nil
		}
		extAt = uint64(be.Uint32(buf[100:]))
	}
	bOff, bLen := be.Uint64(buf[8:]), uint64(be.Uint32(buf[16:]))
	if bOff == 0 {
		return info, true, nil
	}
	if bOff+bLen > uint64(len(buf)) || bLen == 0 || bLen > 1023 {
		return info, false, nil
	}
	name := string(buf[bOff : bOff+bLen])
	if err := PlainFilePath(name); err != nil {
		// qemu-img info would not connect, but what asks next would.
		return info, true, fmt.Errorf("%s: backing file %w", info.Filename, err)
	}
	fmtName, ok := qcow2BackingFormat(buf, extAt, bOff)
	if !ok || fmtName == "" {
		return info, false, nil // a probed format: qemu-img knows
	}
	info.BackingFilename, info.BackingFormat = name, fmtName
	full := name
	if !filepath.IsAbs(full) {
		full = filepath.Join(filepath.Dir(info.Filename), full)
	}
	info.FullBackingFilename = full
	return info, true, nil
}

// qcow2BackingFormat walks the header extensions from at (before end, where
// the backing name starts) for the backing format; ok false if they do
// not parse.
func qcow2BackingFormat(buf []byte, at, end uint64) (string, bool) {
	be := binary.BigEndian
	for at+8 <= end && at+8 <= uint64(len(buf)) {
		typ, n := be.Uint32(buf[at:]), uint64(be.Uint32(buf[at+4:]))
		if typ == qcow2ExtEnd {
			return "", true
		}
		if at+8+n > uint64(len(buf)) {
			return "", false
		}
		if typ == qcow2ExtBackingFo {
			return string(buf[at+8 : at+8+n]), true
		}
		at += 8 + (n+7)&^7
	}
	return "", false
}

// allocated is the bytes the file takes on disk, as qemu-img's actual-size.
func allocated(st os.FileInfo) int64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Blocks * 512
	}
	return 0
}
