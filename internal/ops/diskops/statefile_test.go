package diskops

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestReadStateMachine: the machine type from a memory state's header
// (its configuration section); a stream without one, or not a stream,
// names none.
func TestReadStateMachine(t *testing.T) {
	stream := func(magic, version uint32, section byte, name string) []byte {
		var b bytes.Buffer
		binary.Write(&b, binary.BigEndian, magic)
		binary.Write(&b, binary.BigEndian, version)
		b.WriteByte(section)
		binary.Write(&b, binary.BigEndian, uint32(len(name)))
		b.WriteString(name)
		b.WriteString("\x01more sections")
		return b.Bytes()
	}
	for _, c := range []struct {
		name string
		b    []byte
		want string
		err  string
	}{
		{"q35", stream(stateMagic, stateVersion, stateConfiguration, "pc-q35-7.2"), "pc-q35-7.2", ""},
		{"i440fx", stream(stateMagic, stateVersion, stateConfiguration, "pc-i440fx-10.0"), "pc-i440fx-10.0", ""},
		{"no configuration", stream(stateMagic, stateVersion, 0x01, "ram"), "", errNoMachine.Error()},
		{"not a stream", stream(0x7f454c46, 2, stateConfiguration, "x"), "", "not a QEMU migration stream"},
		{"truncated", stream(stateMagic, stateVersion, stateConfiguration, "pc-q35-7.2")[:12], "", "unexpected EOF"},
		{"empty", nil, "", "EOF"},
	} {
		got, err := readStateMachine(bytes.NewReader(c.b))
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: %q, %v; want %q, %q", c.name, got, err, c.want, c.err)
		}
	}
}

// TestRevertGaveUp: a revert that gives up says so in one line: which
// start failed and why (the start step's cause), where the VM and the
// snapshot are, and what boots it.
func TestRevertGaveUp(t *testing.T) {
	cause := errors.New("read the memory state: migration failed: load of migration failed")
	e := &revertGaveUp{tag: "m1", memory: true, err: fmt.Errorf("wrapped: %w", cause)}
	want := `revert to "m1": the VM did not resume from the snapshot's memory state (wrapped: read the memory state: migration failed: load of migration failed); ` +
		`it is off on the snapshot's disks, the snapshot is kept: vmsup up boots it from them`
	if e.Error() != want || !errors.Is(e, cause) || strings.Contains(e.Error(), "\n") {
		t.Errorf("%q\nwant %q", e.Error(), want)
	}
}
