package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/ops/livemigrate"
)

// Supervisor manages the VMs under one Root: the public front over the
// lifecycle (internal/machine's Env, handed down to every feature) and the
// feature packages it wires to it.
type Supervisor struct {
	env *machine.Env
}

// New returns a Supervisor. It does not connect to systemd until a command
// needs it, so pure commands (argv, validate) work without one.
func New(opts Options) (*Supervisor, error) {
	env, err := machine.New(opts)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{env: env}
	s.registerRecoverers()
	return s, nil
}

// registerRecoverers registers each feature's recoverers with the
// operation kernel (the lifecycle registered its own): a kind with none is
// refused by Begin.
func (s *Supervisor) registerRecoverers() {
	s.hotplug().Register()
	s.applier().Register()
	livemigrate.Register(s.env.Ops(), s.env)
	s.diskops().Register()
}

// Remove forgets a VM that is not running ("virsh undefine"): its state
// directory, vmsup's records, leftovers of its host set-up and its autostart
// mark. Disk images are the user's and stay. A running VM is refused, and
// so is one whose snapshots other VMs were cloned from.
func (s *Supervisor) Remove(ctx context.Context, name string) error {
	_, err := s.RemoveVM(ctx, name)
	return err
}
