package storage

import (
	"errors"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestOpenFile: a boot file is opened beneath its place and its object
// checked as a disk image's: a hard link to a root-only file, a symlink, a
// directory, a FIFO and a file a QEMU user owns are refused with one line
// naming the path; a plain file opens and reads.
func TestOpenFile(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	at := func(n string) string { return filepath.Join(dir, n) }
	secret := filepath.Join(other, "secret")
	must(t, os.WriteFile(secret, []byte("root only"), 0o600))
	must(t, os.Link(secret, at("hard")))
	must(t, os.Symlink(secret, at("link")))
	must(t, os.Mkdir(at("dir"), 0o755))
	must(t, syscall.Mkfifo(at("fifo"), 0o600))
	must(t, os.WriteFile(at("kernel"), []byte("a kernel"), 0o644))
	cases := []struct {
		name string
		want error
		text string
	}{
		{"hard", ErrHardLinked, "has more than one hard link (2)"},
		{"link", ErrNotBeneath, "is a symlink: refused, boot files are opened by their own name"},
		{"dir", ErrNotDiskObject, "is a directory, not a regular file"},
		{"fifo", ErrNotDiskObject, "is a FIFO, not a regular file"},
		{"missing", os.ErrNotExist, "no such file"},
		{"kernel", nil, ""},
	}
	if u, err := user.Lookup("vmsup-qemu"); err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		must(t, os.WriteFile(at("qemus"), []byte("written by a QEMU"), 0o644))
		must(t, os.Chown(at("qemus"), uid, 0))
		cases = append(cases, struct {
			name string
			want error
			text string
		}{"qemus", ErrForeignOwner, "is owned by a VM's QEMU user (vmsup-qemu)"})
	}
	for _, c := range cases {
		f, o, err := OpenFile(dir, at(c.name))
		if c.want == nil {
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			b, _ := io.ReadAll(f)
			f.Close()
			if string(b) != "a kernel" || o.Size != int64(len(b)) || o.Kind != ObjectRegular {
				t.Errorf("%s: read %q, object %+v", c.name, b, o)
			}
			continue
		}
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) || !strings.HasPrefix(err.Error(), at(c.name)) ||
			strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want %v, one line starting with the path, saying %q", c.name, err, c.want, c.text)
		}
	}
}
