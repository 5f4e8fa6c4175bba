package identity

import (
	"fmt"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// on72 resolves as QEMU 7.2 does, offering only its own and 6.2's types.
func on72(name string) (string, error) {
	switch name {
	case "q35":
		return "pc-q35-7.2", nil
	case "pc":
		return "pc-i440fx-7.2", nil
	case "pc-q35-7.2", "pc-q35-6.2", "pc-i440fx-7.2":
		return name, nil
	}
	return "", fmt.Errorf("QEMU 7.2.19 has no machine type %q", name)
}

func TestPinMachine(t *testing.T) {
	for _, c := range []struct{ want, recorded, got, err string }{
		{"q35", "", "pc-q35-7.2", ""},                  // first start: the alias resolved
		{"q35", "pc-q35-6.2", "pc-q35-6.2", ""},        // later starts keep the pin (QEMU upgraded since)
		{"q35", "q35", "pc-q35-7.2", ""},               // an unversioned record pins nothing
		{"pc", "pc-q35-6.2", "pc-i440fx-7.2", ""},      // another family: resolved anew
		{"pc-q35-7.2", "pc-q35-6.2", "pc-q35-7.2", ""}, // the file moves the VM to a newer type
		{"pc-q35-10.0", "", "", "has no machine type"}, // a type this QEMU lacks
		{"q35", "pc-q35-2.0", "", "pc-q35-2.0, kept since its first start, is not offered here"},
	} {
		got, err := PinMachine(c.want, c.recorded, on72)
		if got != c.got || (c.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("PinMachine(%s, %q) = %q, %v; want %q, %q", c.want, c.recorded, got, err, c.got, c.err)
		}
	}
}

func TestKeepMachine(t *testing.T) {
	for _, c := range []struct{ want, recorded, running string }{
		{"q35", "pc-q35-7.2", "q35"},                // the alias of the pinned family: no change
		{"pc-q35-7.2", "pc-q35-7.2", "pc-q35-7.2"},  // the pinned type itself: no change
		{"pc-q35-10.0", "pc-q35-7.2", "pc-q35-7.2"}, // a move: shown from the pinned type
		{"pc", "pc-q35-7.2", "pc-q35-7.2"},          // another family
		{"pc", "", "q35"},                           // no pin recorded (an older record): as it was
	} {
		running, want := &spec.VM{Machine: "q35"}, &spec.VM{Machine: c.want}
		KeepMachine(running, want, c.recorded)
		if running.Machine != c.running {
			t.Errorf("KeepMachine(want %s, recorded %q): running %s, want %s", c.want, c.recorded, running.Machine, c.running)
		}
	}
}
