package caps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestCheckGuestDevs: what a [tpm] or a [[share]] needs on the host is
// checked before anything starts, each error naming its field.
func TestCheckGuestDevs(t *testing.T) {
	dir := t.TempDir()
	elf := filepath.Join(dir, "vmlinux")
	bz := filepath.Join(dir, "vmlinuz")
	notDir := filepath.Join(dir, "file")
	for p, data := range map[string]string{elf: "\x7fELF....", bz: "MZ......", notDir: "x"} {
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A PATH with a stand-in swtpm and swtpm_setup, or none.
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"swtpm", "swtpm_setup"} {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name, path, body, want string
	}{
		{"ok", bin, "[tpm]\n[boot]\nkernel = \"vmlinuz\"\n", ""},
		{"no swtpm", dir, "[tpm]\n[boot]\nkernel = \"vmlinuz\"\n", "tpm: swtpm is not installed (apt-get install swtpm swtpm-tools)"},
		{"elf kernel", bin, "[tpm]\n[boot]\nkernel = \"vmlinux\"\n", "boot.kernel: " + elf + " is an ELF kernel (PVH boot)"},
		{"share missing", bin, "[[share]]\npath = \"nope\"\ntag = \"t\"\n[boot]\nkernel = \"vmlinuz\"\n",
			"share[0].path: " + filepath.Join(dir, "nope") + ": no such directory"},
		{"share file", bin, "[[share]]\npath = \"file\"\ntag = \"t\"\n[boot]\nkernel = \"vmlinuz\"\n",
			"share[0].path: " + notDir + " is not a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("PATH", c.path)
			f, err := spec.Parse(filepath.Join(dir, "vm.toml"), []byte("name = \"g\"\nmemory = \"256M\"\n"+c.body))
			if err != nil {
				t.Fatal(err)
			}
			err = checkGuestDevs(f)
			if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
				t.Errorf("got %v, want %q", err, c.want)
			}
		})
	}
	if _, err := VirtioFSD(); err == nil {
		t.Log("virtiofsd is installed here: its missing case is not shown")
	} else if !strings.Contains(err.Error(), "virtiofs needs virtiofsd, which is not installed") {
		t.Errorf("VirtioFSD: %v", err)
	}
}
