package memstate

import (
	"encoding/hex"
	"strings"
	"testing"
)

// Starts of real state files (QEMU 10.0.2, q35, -m 64): with mapped-ram,
// then a plain stream.
const (
	mappedHead = "5145564d 00000003 07 0000000b 70632d7133352d31302e30" +
		"05 1a 636f6e66696775726174696f6e2f6361706162696c6974696573 00000001 00000001 0a 6d61707065642d72616d" +
		"01 00000001 03 72616d"
	plainHead = "5145564d 00000003 07 0000000b 70632d7133352d31302e30 01 00000001 03 72616d"
)

func TestParseHeader(t *testing.T) {
	for _, c := range []struct {
		name, hex, machine string
		mapped             bool
		err                string
		cut                int // bytes cut off the end
	}{
		{"mapped-ram", mappedHead, "pc-q35-10.0", true, "", 0},
		{"stream", plainHead, "pc-q35-10.0", false, "", 0},
		{"no configuration", "5145564d 00000003 01", "", false, "", 0},
		{"not a state", "00000000 00000003 07 00", "", false, "not a QEMU memory state", 0},
		{"cut in the capabilities", mappedHead, "pc-q35-10.0", false, "unexpected EOF", 12},
	} {
		b, err := hex.DecodeString(strings.ReplaceAll(c.hex, " ", ""))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		h, err := parseHeader(b[:len(b)-c.cut])
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || h.Machine != c.machine || h.MappedRAM() != c.mapped {
			t.Errorf("%s: %+v %v, want machine %q mapped-ram %v", c.name, h, err, c.machine, c.mapped)
		}
	}
}

func TestWayOf(t *testing.T) {
	if w := WayOf([]string{"events", "multifd"}); w.File || w.MappedRAM {
		t.Errorf("QEMU 7.2's capabilities: %+v, want fd:", w)
	}
	if w := WayOf([]string{"events", "mapped-ram"}); !w.File || !w.MappedRAM {
		t.Errorf("QEMU 10's capabilities: %+v, want file: with mapped-ram", w)
	}
}
