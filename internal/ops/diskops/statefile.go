package diskops

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// A memory state file is a QEMU migration stream. It begins with the
// file's magic and version and, from machine types 2.9 on, a
// configuration section naming the machine type it was saved with (QEMU's
// vmstate_configuration: a big-endian length, then the name); QEMU refuses
// to load it into another ("Machine type received is ...").

const (
	stateMagic         = 0x5145564d // "QEVM"
	stateVersion       = 3
	stateConfiguration = 0x07
)

// errNoMachine: the stream names no machine type (an old one, or not a
// stream QEMU wrote).
var errNoMachine = errors.New("the memory state names no machine type")

// StateMachine reads the machine type a memory state file was saved with
// from its header.
func StateMachine(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return readStateMachine(bufio.NewReader(io.LimitReader(f, 4096)))
}

func readStateMachine(r io.Reader) (string, error) {
	var hdr struct {
		Magic, Version uint32
		Section        uint8
		Len            uint32
	}
	if err := binary.Read(r, binary.BigEndian, &hdr); err != nil {
		return "", fmt.Errorf("memory state header: %w", err)
	}
	switch {
	case hdr.Magic != stateMagic || hdr.Version != stateVersion:
		return "", fmt.Errorf("memory state header: not a QEMU migration stream (magic %#x, version %d)", hdr.Magic, hdr.Version)
	case hdr.Section != stateConfiguration, hdr.Len == 0, hdr.Len > 256:
		return "", errNoMachine
	}
	name := make([]byte, hdr.Len)
	if _, err := io.ReadFull(r, name); err != nil {
		return "", fmt.Errorf("memory state header: %w", err)
	}
	return string(name), nil
}
