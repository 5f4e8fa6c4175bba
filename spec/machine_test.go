package spec

import (
	"strings"
	"testing"
)

func TestMachineFamily(t *testing.T) {
	for name, want := range map[string]string{
		"q35": "q35", "pc": "pc", "pc-q35-7.2": "q35", "pc-q35-10.0": "q35", "pc-i440fx-6.2": "pc",
		"pc-q35": "", "pc-q35-7": "", "pc-i440fx-7.2.1": "", "microvm": "", "": "", "q35-7.2": "",
	} {
		if got := MachineFamily(name); got != want {
			t.Errorf("MachineFamily(%q) = %q, want %q", name, got, want)
		}
	}
	if MachineVersioned("q35") || !MachineVersioned("pc-q35-7.2") {
		t.Error("MachineVersioned: an alias is not versioned, pc-q35-7.2 is")
	}
}

func TestValidateVersionedMachine(t *testing.T) {
	base := "name = \"x\"\nmemory = \"256M\"\nboot.kernel = \"/vmlinuz\"\n"
	for _, c := range []struct{ machine, err string }{
		{"pc-q35-7.2", ""},
		{"pc-i440fx-6.2", ""},
		{"pc-q35-7", `machine: unknown machine "pc-q35-7"`},
	} {
		_, err := Parse("/v/x.toml", []byte(base+"machine = \""+c.machine+"\"\n"))
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%s: %v", c.machine, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: got %v, want %q", c.machine, err, c.err)
		}
	}
	// A versioned pc is laid out as pc: no root ports by default, SATA refused.
	f, err := Parse("/v/x.toml", []byte(base+"machine = \"pc-i440fx-6.2\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.VM.Slots() != 0 || f.VM.Q35() {
		t.Fatalf("pc-i440fx-6.2: slots %d, q35 %v, %v", f.VM.Slots(), f.VM.Q35(), err)
	}
	_, err = Parse("/v/x.toml", []byte(base+"machine = \"pc-i440fx-6.2\"\n[[disk]]\nname = \"d\"\nfile = \"/d.img\"\nbus = \"sata\"\n"))
	if err == nil || !strings.Contains(err.Error(), `disk[0].bus: "sata" needs machine "q35"`) {
		t.Errorf("sata on pc-i440fx-6.2: %v", err)
	}
}
