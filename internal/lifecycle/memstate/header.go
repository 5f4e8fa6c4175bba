package memstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
)

// The start of a migration stream (QEMU's migration/savevm.c): magic,
// version, then a configuration section with the machine type and, when
// the writer had capabilities the reader must match (mapped-ram,
// x-ignore-shared), a subsection listing them.
const (
	streamMagic      = 0x5145564d // "QEVM"
	streamVersion    = 3
	sectionConfig    = 0x07 // QEMU_VM_CONFIGURATION
	sectionSub       = 0x05 // QEMU_VM_SUBSECTION
	subCapabilities  = "configuration/capabilities"
	subTargetPageBit = "configuration/target-page-bits"
	headerRead       = 4096 // the configuration section is far shorter
)

// Header is what the start of a state file says.
type Header struct {
	Machine      string   // the machine type it was saved from ("pc-q35-10.0")
	Capabilities []string // the capabilities its reader must have on
}

// MappedRAM reports whether the state was written with mapped-ram.
func (h Header) MappedRAM() bool { return slices.Contains(h.Capabilities, MappedRAM) }

// ReadHeader reads the header at the start of r.
func ReadHeader(r io.ReaderAt) (Header, error) {
	buf := make([]byte, headerRead)
	n, err := r.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Header{}, fmt.Errorf("read the memory state: %w", err)
	}
	return parseHeader(buf[:n])
}

func parseHeader(b []byte) (Header, error) {
	var h Header
	p := &reader{b: b}
	if p.u32() != streamMagic || p.u32() != streamVersion || p.err != nil {
		return h, errors.New("not a QEMU memory state (no QEVM stream header)")
	}
	if p.peek() != sectionConfig {
		return h, nil // QEMU sends it on every machine vmsup makes; an old stream may lack it
	}
	p.u8()
	h.Machine = string(p.bytes(int(p.u32())))
	for p.err == nil && p.peek() == sectionSub {
		p.u8()
		name := string(p.bytes(int(p.u8())))
		p.u32() // the subsection's version
		switch name {
		case subTargetPageBit:
			p.u32()
		case subCapabilities:
			for n := p.u32(); n > 0 && p.err == nil; n-- {
				h.Capabilities = append(h.Capabilities, string(p.bytes(int(p.u8()))))
			}
		default:
			return h, nil // one of unknown length: the capabilities come before it
		}
	}
	if p.err != nil {
		return h, fmt.Errorf("memory state header: %w", p.err)
	}
	return h, nil
}

// reader reads big-endian fields, remembering the first short read.
type reader struct {
	b   []byte
	err error
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n > len(r.b) {
		r.err = io.ErrUnexpectedEOF
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) peek() byte {
	if r.err != nil || len(r.b) == 0 {
		return 0
	}
	return r.b[0]
}

func (r *reader) u8() byte {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}
