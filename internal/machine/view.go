package machine

import (
	"errors"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// View returns the VM as it runs (vmstore.View): the one View every command
// reads its disks, NICs, images and sizes from. Without a record it is
// ErrNotFound; when no QEMU runs the View comes back with an error wrapping
// ErrNotRunning.
func (s *Env) View(name string) (*vmstore.View, error) {
	v, err := s.state.View(name)
	switch {
	case errors.Is(err, vmstore.ErrNoRecord):
		return nil, s.unknownVM(name)
	case err != nil:
		return nil, err
	case !v.Running:
		return v, ErrNotRunning
	}
	return v, nil
}
