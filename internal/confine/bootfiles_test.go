package confine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/atomicfile"
	"github.com/vmsup/vmsup/internal/vmstate"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// TestCopyBootFiles: the kernel, initrd and variable template are copied
// from their checked descriptors into the state directory (a "boot" entry
// planted there is replaced, never followed); a hard-linked initrd and a
// kernel larger than the guest's memory are refused naming the field;
// reuse keeps the copies there are; RemoveBootFiles takes them away.
func TestCopyBootFiles(t *testing.T) {
	imgs, other := t.TempDir(), t.TempDir()
	at := func(n string) string { return filepath.Join(imgs, n) }
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(at("vmlinux"), "kernel 1")
	write(at("initrd"), "initrd 1")
	write(at("vars.fd"), "vars")
	write(filepath.Join(other, "secret"), "root only")
	if err := os.Link(filepath.Join(other, "secret"), at("hard")); err != nil {
		t.Fatal(err)
	}
	m := &Manager{OpenFile: func(field, path string) (*os.File, error) {
		f, _, err := storage.OpenFile(imgs, path)
		return f, err
	}}
	p := vmstate.Store{Root: t.TempDir()}.Paths("v")
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, filepath.Join(p.Dir, "boot")); err != nil { // as QEMU's user could
		t.Fatal(err)
	}
	vm := func(kernel, initrd string) *spec.File {
		return &spec.File{VM: spec.VM{Name: "v", Memory: 64 * spec.MiB,
			Boot: spec.Boot{Kernel: kernel, Initrd: initrd, Firmware: spec.FirmwareUEFI, VarsTemplate: at("vars.fd")}}}
	}
	b, err := m.CopyBootFiles(vm(at("vmlinux"), at("initrd")), p, true, false)
	if err != nil {
		t.Fatal(err)
	}
	want := BootCopies{Kernel: filepath.Join(p.Dir, "boot/kernel"), Initrd: filepath.Join(p.Dir, "boot/initrd"), MadeVars: true}
	if b != want {
		t.Errorf("copies %+v, want %+v", b, want)
	}
	for path, s := range map[string]string{b.Kernel: "kernel 1", b.Initrd: "initrd 1", p.UEFIVars: "vars"} {
		if got, err := os.ReadFile(path); string(got) != s {
			t.Errorf("%s: %q %v, want %q", path, got, err, s)
		}
	}
	if ents, _ := os.ReadDir(other); len(ents) != 1 {
		t.Errorf("the planted symlink's target was written: %v", ents)
	}

	_, err = m.CopyBootFiles(vm(at("vmlinux"), at("hard")), p, true, false)
	if err == nil || !strings.HasPrefix(err.Error(), "boot.initrd: "+at("hard")+" has more than one hard link") {
		t.Errorf("a hard-linked initrd: %v", err)
	}
	write(at("big"), strings.Repeat("k", 64<<20+1))
	if _, err = m.CopyBootFiles(vm(at("big"), ""), p, true, false); !errors.Is(err, atomicfile.ErrTooLarge) ||
		!strings.HasPrefix(err.Error(), "boot.kernel: ") {
		t.Errorf("a kernel larger than the guest's memory: %v", err)
	}

	write(at("vmlinux"), "kernel 2")
	if _, err := m.CopyBootFiles(vm(at("vmlinux"), at("initrd")), p, false, true); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(b.Kernel); string(got) != "kernel 1" {
		t.Errorf("reuse copied the kernel again: %q", got)
	}
	if _, err := m.CopyBootFiles(vm(at("vmlinux"), at("initrd")), p, false, false); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(b.Kernel); string(got) != "kernel 2" {
		t.Errorf("a start did not copy the kernel again: %q", got)
	}
	if err := RemoveBootFiles(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(p.Dir, "boot")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the copies are still there: %v", err)
	}
	if _, err := os.Stat(p.UEFIVars); err != nil {
		t.Errorf("the variable store went with the copies: %v", err)
	}
}
