package supervisor

import (
	"context"
	"encoding/json"
	"time"

	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/internal/vm/eventlog"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/spec"
)

// Events a watcher of a running VM records in its history (the fleet
// agent's disk I/O check): its disk I/O stalled or failing, and back.
const (
	EventDegraded  = "degraded"
	EventRecovered = "recovered"
)

// DiskIO samples the running VM's disk I/O over its monitor: per disk the
// requests ended, failed and in flight, the time since the last one ended
// and the io-status (internal/observe/iohealth judges samples over time). It only
// reads.
func (s *Supervisor) DiskIO(ctx context.Context, name string) (iohealth.Sample, error) {
	if err := spec.ValidName(name); err != nil {
		return iohealth.Sample{}, vmerr.Wrap(name, err)
	}
	c, release, err := s.env.QMPSession(ctx, name)
	if err != nil {
		return iohealth.Sample{}, err
	}
	defer release()
	smp, err := iohealth.Read(ctx, c)
	if err != nil {
		return smp, vmerr.Wrap(name, err)
	}
	return smp, nil
}

// RecordEvent adds a vmsup event (EventDegraded, EventRecovered) with its
// reason to the VM's history, which vmsup events shows.
func (s *Supervisor) RecordEvent(name, event, reason string) error {
	if err := spec.ValidName(name); err != nil {
		return vmerr.Wrap(name, err)
	}
	data, _ := json.Marshal(map[string]string{"reason": reason})
	r := eventlog.Record{Time: time.Now().UTC(), VM: name, Source: eventlog.SourceVmsup, Event: event, Data: data}
	if err := eventlog.Append(s.env.Paths(name).EventHistory(), r); err != nil {
		return vmerr.Wrap(name, err)
	}
	return nil
}
