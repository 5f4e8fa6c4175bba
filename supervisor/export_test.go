package supervisor

import "github.com/vmsup/vmsup/units"

// GuardianUnits are the units of VM name's guardians (the operation's
// settle guardian, the restart guardian), as vmsup starts them: for tests
// that measure their confinement without an operation to settle.
func (s *Supervisor) GuardianUnits(name string) []units.Unit { return s.env.GuardianUnits(name) }
