package machine

import (
	"context"

	"github.com/vmsup/vmsup/units"
)

// UnitJournal reads the messages of the units o names from the journal the
// VMs' systemd writes (Options.JournalDir when that is not the host's).
func (s *Env) UnitJournal(ctx context.Context, o units.JournalOptions, fn func(units.Entry)) error {
	o.Dir = s.opts.JournalDir
	return units.Journal(ctx, o, fn)
}
