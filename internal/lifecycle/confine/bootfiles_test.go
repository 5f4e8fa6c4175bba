package confine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// TestCopyBootFiles: the kernel, initrd and variable template are copied
// from their checked descriptors into the state directory, root's and
// readable (a "boot" entry planted there is replaced, never followed); a
// hard-linked initrd and a kernel larger than the guest's memory are
// refused naming the field; the next start keeps a copy whose source is
// unchanged and copies a changed one again, or one in a boot directory
// of another user's; reuse keeps the copies there are.
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
	p := vmstore.Store{Root: t.TempDir()}.Paths("v")
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
	for path, mode := range map[string]os.FileMode{filepath.Dir(b.Kernel): os.ModeDir | 0o755, b.Kernel: 0o644} {
		var st unix.Stat_t
		if fi, err := os.Lstat(path); err != nil || fi.Mode() != mode || unix.Lstat(path, &st) != nil || st.Uid != 0 {
			t.Errorf("%s: %v (uid %d) %v, want root's %v", path, fi.Mode(), st.Uid, err, mode)
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

	ino := func() uint64 {
		var st unix.Stat_t
		unix.Stat(b.Kernel, &st)
		return st.Ino
	}
	if _, err := m.CopyBootFiles(vm(at("vmlinux"), at("initrd")), p, false, false); err != nil {
		t.Fatal(err)
	}
	kept := ino()
	if _, err := m.CopyBootFiles(vm(at("vmlinux"), at("initrd")), p, false, false); err != nil || ino() != kept {
		t.Errorf("an unchanged kernel was copied again (%v)", err)
	}
	// A boot directory QEMU's user could have changed is made anew.
	planted := filepath.Join(filepath.Dir(b.Kernel), "planted")
	write(planted, "")
	if err := os.Chown(filepath.Dir(b.Kernel), 12345, 12345); err != nil {
		t.Fatal(err)
	}
	if _, err := m.CopyBootFiles(vm(at("vmlinux"), at("initrd")), p, false, false); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if _, err := os.Lstat(planted); !errors.Is(err, os.ErrNotExist) || unix.Stat(filepath.Dir(b.Kernel), &st) != nil || st.Uid != 0 {
		t.Errorf("a boot directory of another user's was kept (%v, uid %d)", err, st.Uid)
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
		t.Errorf("a start kept the copy of a changed kernel: %q", got)
	}
}

// BenchmarkCopyBootFiles is what a start's boot-files step costs for the
// test guest (its kernel and initrd, opened beneath their directory,
// checked, and copied into a state directory on the same file system as
// the tests' temporary files): "copy" where there is no copy yet (a first
// start, a changed kernel), "kept" where the copy was made from the same
// unchanged file (every later start): go test ./internal/lifecycle/confine -run '^$'
// -bench CopyBootFiles -benchtime 20x.
func BenchmarkCopyBootFiles(b *testing.B) {
	g, err := testenv.Guest(b.Context())
	if err != nil {
		b.Skipf("no test guest: %v", err)
	}
	m := &Manager{OpenFile: func(field, path string) (*os.File, error) {
		f, _, err := storage.OpenFile(filepath.Dir(path), path)
		return f, err
	}}
	p := vmstore.Store{Root: b.TempDir()}.Paths("bench")
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		b.Fatal(err)
	}
	f := &spec.File{VM: spec.VM{Name: "bench", Memory: 256 * spec.MiB, Boot: spec.Boot{Kernel: g.Kernel, Initrd: g.Initrd}}}
	var size int64
	for _, p := range []string{g.Kernel, g.Initrd} {
		if fi, err := os.Stat(p); err == nil {
			size += fi.Size()
		}
	}
	for _, kept := range []bool{false, true} {
		b.Run(map[bool]string{false: "copy", true: "kept"}[kept], func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				if !kept {
					b.StopTimer()
					os.RemoveAll(filepath.Join(p.Dir, bootDir))
					b.StartTimer()
				}
				if _, err := m.CopyBootFiles(f, p, true, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
