package vmstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/spec"
)

// WriteVMFile writes vm as the VM file vmsup keeps for it (File),
// root-writable and readable by all, and returns its path.
func (s Store) WriteVMFile(vm spec.VM) (string, error) {
	raw, err := toml.Marshal(vm)
	if err != nil {
		return "", err
	}
	path := s.File(vm.Name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", err
	}
	head := fmt.Sprintf("# VM %q: written by vmsup when it made the VM; edit it and vmsup apply %s.\n", vm.Name, vm.Name)
	return path, atomicfile.WriteFile(path, append([]byte(head), raw...), 0o644)
}

// RemoveVMFile removes the file vmsup wrote for the VM, if any.
func (s Store) RemoveVMFile(name string) error {
	if err := os.Remove(s.File(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
