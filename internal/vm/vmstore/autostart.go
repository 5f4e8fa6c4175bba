package vmstore

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"

	"github.com/vmsup/vmsup/spec"
)

// Autostart marks: ROOT/autostart/NAME.toml, a symlink to the file the VM
// starts from at boot (like "systemctl enable").

func (s Store) autostartDir() string { return filepath.Join(s.Root, "autostart") }

// AutostartMark is the VM's mark.
func (s Store) AutostartMark(name string) string {
	return filepath.Join(s.autostartDir(), name+".toml")
}

// Mark links the VM's mark to file; old is the file it pointed to before
// ("" if none).
func (s Store) Mark(name, file string) (old string, err error) {
	if err := os.MkdirAll(s.autostartDir(), 0o755); err != nil {
		return "", err
	}
	mark := s.AutostartMark(name)
	old, _ = os.Readlink(mark)
	return old, renameio.Symlink(file, mark)
}

// Unmark removes the VM's mark; none is not an error.
func (s Store) Unmark(name string) error {
	if err := os.Remove(s.AutostartMark(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// IsMarked reports whether the VM is enabled for boot.
func (s Store) IsMarked(name string) bool {
	_, err := os.Lstat(s.AutostartMark(name))
	return err == nil
}

// Marked lists the VMs enabled for boot, with the file each starts from.
func (s Store) Marked() (map[string]string, error) {
	ents, err := os.ReadDir(s.autostartDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".toml")
		if !ok || spec.ValidName(n) != nil {
			continue
		}
		if t, err := os.Readlink(filepath.Join(s.autostartDir(), e.Name())); err == nil {
			out[n] = t
		}
	}
	return out, nil
}
