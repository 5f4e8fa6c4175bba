package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Header reading from a descriptor: what vmsup decides from is what it read
// from the object it opened, never what a second open of the name finds.

const (
	qcow2ExtDataFile     = 0x44415441 // "DATA": the external data file's name
	qcow2IncompatData    = 1 << 2     // incompatible feature: external data file
	qcow2ExtMax          = 4096       // extensions walked at most (a loop of zero-length ones ends)
	maxBackingName       = 1023       // QEMU's own bound on the backing name
	defaultMaxVirtualGiB = 64 << 10   // 64 TiB: more than any disk vmsup makes
)

// ErrExternalDataFile is a qcow2 image whose data lives in another file its
// header names: QEMU would open that file too, unchecked.
var ErrExternalDataFile = errors.New("names an external data file (qcow2 data_file)")

// ErrNotLocalBacking is a backing file name that is not a plain file path
// (json:, nbd:, a URL, any driver: prefix): QEMU would open a protocol.
var ErrNotLocalBacking = errors.New("is not a plain file path")

// ErrTooLarge is an image whose virtual size is beyond the bound.
var ErrTooLarge = errors.New("virtual size beyond the bound")

// ErrNoBackingFormat is a base named without its format: QEMU would probe
// it, and a probed format (vmdk, a qcow2 header in a raw base) names more
// files.
var ErrNoBackingFormat = errors.New("names its base without the base's format")

// Header is what vmsup reads itself of an image's header.
type Header struct {
	Format        string // raw or qcow2
	VirtualSize   int64
	Backing       string // the backing file's name as written ("" none)
	BackingFormat string
}

// ReadHeader reads f's header as format (raw or qcow2) from the descriptor
// (pread: f's offset is left alone). It refuses a qcow2 image with an
// external data file, an encrypted one, and a backing name that is not a
// plain file path, without opening or connecting to anything.
func ReadHeader(f *os.File, format string, size int64) (Header, error) {
	h := Header{Format: format, VirtualSize: (size + 511) &^ 511}
	switch format {
	case spec.FormatRaw:
		return h, nil
	case spec.FormatQcow2:
	default:
		return h, fmt.Errorf("%s: format %q: vmsup reads raw and qcow2 images only", f.Name(), format)
	}
	buf := make([]byte, headerRead)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return h, fmt.Errorf("read header of %s: %w", f.Name(), err)
	}
	return parseQcow2(f.Name(), buf[:n])
}

// parseQcow2 is ReadHeader's qcow2 part, on the bytes read.
func parseQcow2(name string, buf []byte) (Header, error) {
	be := binary.BigEndian
	h := Header{Format: spec.FormatQcow2}
	bad := func(why string) (Header, error) {
		return h, fmt.Errorf("%s is not a qcow2 image vmsup can read: %s", name, why)
	}
	if len(buf) < qcow2V2HeaderLen || be.Uint32(buf) != qcow2Magic {
		return bad("no qcow2 header")
	}
	version := be.Uint32(buf[4:])
	if version != 2 && version != 3 {
		return bad(fmt.Sprintf("version %d", version))
	}
	if be.Uint32(buf[32:]) != 0 {
		return bad("encrypted (crypt_method)")
	}
	if cb := be.Uint32(buf[20:]); cb < 9 || cb > 21 {
		return bad(fmt.Sprintf("cluster bits %d", cb))
	}
	h.VirtualSize = int64(be.Uint64(buf[24:]))
	if h.VirtualSize < 0 {
		return bad("negative size")
	}
	extAt := uint64(qcow2V2HeaderLen)
	if version == 3 {
		if len(buf) < 104 {
			return bad("short version 3 header")
		}
		incompat := be.Uint64(buf[72:])
		if incompat&qcow2IncompatData != 0 {
			return h, fmt.Errorf("%s %w: refused, QEMU would open it unchecked", name, ErrExternalDataFile)
		}
		if incompat&^qcow2KnownIncompat != 0 {
			return bad(fmt.Sprintf("incompatible features %#x", incompat&^qcow2KnownIncompat))
		}
		extAt = uint64(be.Uint32(buf[100:]))
	}
	bOff, bLen := be.Uint64(buf[8:]), uint64(be.Uint32(buf[16:]))
	end := uint64(len(buf))
	if bOff != 0 {
		if bLen == 0 || bLen > maxBackingName || bOff+bLen > uint64(len(buf)) {
			return bad("backing file name out of bounds")
		}
		end = bOff
	}
	exts, err := qcow2Extensions(buf, extAt, end)
	if err != nil {
		return bad(err.Error())
	}
	if _, ok := exts[qcow2ExtDataFile]; ok {
		return h, fmt.Errorf("%s %w: refused, QEMU would open it unchecked", name, ErrExternalDataFile)
	}
	if bOff == 0 {
		return h, nil
	}
	h.Backing = string(buf[bOff : bOff+bLen])
	h.BackingFormat = exts[qcow2ExtBackingFo]
	if err := PlainFilePath(h.Backing); err != nil {
		return h, fmt.Errorf("%s: backing file %w", name, err)
	}
	return h, nil
}

// qcow2Extensions walks every header extension from at (before end) up to
// the end marker: type -> data.
func qcow2Extensions(buf []byte, at, end uint64) (map[uint32]string, error) {
	be := binary.BigEndian
	out := map[uint32]string{}
	for i := 0; i < qcow2ExtMax; i++ {
		if at+8 > end || at+8 > uint64(len(buf)) {
			return nil, errors.New("header extensions run past the header")
		}
		typ, n := be.Uint32(buf[at:]), uint64(be.Uint32(buf[at+4:]))
		if typ == qcow2ExtEnd {
			return out, nil
		}
		if at+8+n > uint64(len(buf)) {
			return nil, errors.New("header extension out of bounds")
		}
		out[typ] = string(buf[at+8 : at+8+n])
		at += 8 + (n+7)&^7
	}
	return nil, errors.New("too many header extensions")
}

// PlainFilePath refuses a backing name QEMU would not take as a plain file
// path: a json: or any other protocol prefix ("nbd:", "driver:" before the
// first "/", as QEMU's path_has_protocol decides), a URL, an empty name.
func PlainFilePath(name string) error {
	colon, slash := strings.IndexByte(name, ':'), strings.IndexByte(name, '/')
	switch {
	case name == "" || strings.ContainsRune(name, 0):
		return fmt.Errorf("%q %w", name, ErrNotLocalBacking)
	case strings.Contains(name, "://"), colon >= 0 && (slash < 0 || colon < slash):
		return fmt.Errorf("%q %w (a protocol QEMU would open): refused without connecting", name, ErrNotLocalBacking)
	}
	return nil
}
