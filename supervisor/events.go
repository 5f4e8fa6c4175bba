package supervisor

import (
	"context"
	"time"

	"github.com/vmsup/vmsup/internal/observe/events"
)

// A VM's events are read in internal/observe/events (QEMU's event log and the
// VM's history, no resident process); here the supervisor writes the
// history: its lifecycle events, and a QEMU's events when it ends.

// Lifecycle events vmsup writes.
const (
	EventStarted = events.Started
	EventStopped = events.Stopped
	EventCrashed = events.Crashed
	EventApplied = events.Applied
)

// FollowEvents calls emit with the events of the VMs at or after since, in
// time order, then (follow) with each new one until ctx ends. It reads the
// VMs' histories and their running QEMUs' event logs: it takes nothing
// from QEMU, so any number can run.
func (s *Supervisor) FollowEvents(ctx context.Context, names []string, since time.Time, follow bool, emit func(Event) error) error {
	return events.Follow(ctx, s.env, names, since, follow, emit)
}
