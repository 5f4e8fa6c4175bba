// Package iohealth tells whether a VM's disk I/O is stalled or failing,
// from what QEMU reports over QMP: per disk, how many requests have ended
// (done or failed) and how long ago the last one did (query-blockstats),
// how many the virtio device has taken from the guest and not yet answered
// (x-query-virtio-queue-status), and whether an I/O error stopped the
// guest (query-block's io-status).
//
// A storage link that stops answering (a host cut from Ceph, a dead iSCSI
// path) fails nothing: librbd and the kernel retry, the requests stay in
// flight, QEMU and the guest look healthy. Only the requests that never
// end show it, so a disk is stalled when some are in flight and none has
// ended for a bound.
//
// Read takes one sample; Detector judges samples over time. The package
// only reads and judges: the fleet agent reports, the scheduler may act.
package iohealth

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

// Monitor is the QMP a sample needs (a *qmp.Conn has it).
type Monitor interface {
	QueryBlockstats(ctx context.Context) ([]qmp.BlockStats, error)
	QueryBlock(ctx context.Context) ([]qmp.BlockInfo, error)
	QueryVirtioStatus(ctx context.Context, path string) (qmp.VirtioStatus, error)
	QueryVirtQueueStatus(ctx context.Context, path string, queue int) (qmp.VirtQueueStatus, error)
}

var _ Monitor = (*qmp.Conn)(nil)

// Disk is one disk's I/O at one moment.
type Disk struct {
	Name   string
	Ended  uint64 // requests ended since QEMU started, failed ones included
	Failed uint64 // requests failed since QEMU started
	// InFlight is the requests the device took from the guest and has not
	// answered; -1 when unknown (not virtio-blk, or a QEMU without the
	// x-query-virtio commands).
	InFlight int
	// Idle is the time since the last request ended; -1 before the first.
	Idle     time.Duration
	IOStatus qmp.IOStatus // "" unless the error policy can stop the guest
}

// Sample is a VM's disks at one moment.
type Sample struct {
	At    time.Time
	Disks []Disk
}

// Read samples the VM's disks (the "disk-NAME" devices vmsup adds).
func Read(ctx context.Context, m Monitor) (Sample, error) {
	bs, err := m.QueryBlockstats(ctx)
	if err != nil {
		return Sample{}, fmt.Errorf("disk I/O: %w", err)
	}
	s := Sample{At: time.Now()}
	for _, b := range bs {
		name, ok := diskName(b.QdevID)
		if !ok {
			continue
		}
		st := b.Stats
		failed := st.FailedReadOps + st.FailedWriteOps + st.FailedFlushOps + st.FailedUnmapOps
		d := Disk{Name: name, Ended: st.ReadOps + st.WriteOps + st.FlushOps + st.UnmapOps + failed, Failed: failed,
			InFlight: inFlight(ctx, m, b.QdevID), Idle: -1}
		if st.IdleTimeNanos != nil {
			d.Idle = time.Duration(*st.IdleTimeNanos)
		}
		s.Disks = append(s.Disks, d)
	}
	if bi, err := m.QueryBlock(ctx); err == nil {
		for _, b := range bi {
			if name, ok := diskName(b.QdevID); ok {
				if i := slices.IndexFunc(s.Disks, func(d Disk) bool { return d.Name == name }); i >= 0 {
					s.Disks[i].IOStatus = b.IOStatus
				}
			}
		}
	}
	slices.SortFunc(s.Disks, func(a, b Disk) int { return strings.Compare(a.Name, b.Name) })
	return s, nil
}

// diskName is NAME of a vmsup disk's device path
// (/machine/peripheral/disk-NAME[/virtio-backend]).
func diskName(qdev string) (string, bool) {
	id, _, _ := strings.Cut(strings.TrimPrefix(qdev, "/machine/peripheral/"), "/")
	return strings.CutPrefix(id, "disk-")
}

// inFlight sums the in-use entries of a virtio-blk device's queues; -1
// when that cannot be read.
func inFlight(ctx context.Context, m Monitor, qdev string) int {
	if !strings.HasSuffix(qdev, "/virtio-backend") {
		return -1
	}
	vs, err := m.QueryVirtioStatus(ctx, qdev)
	if err != nil {
		return -1
	}
	n := 0
	for q := range vs.NumVQs {
		qs, err := m.QueryVirtQueueStatus(ctx, qdev, q)
		if err != nil {
			return -1
		}
		n += qs.InUse
	}
	return n
}

// StalledNow judges one sample alone, for a reader that keeps no history
// (a metrics scrape): requests are in flight and none has ended for bound.
// A request sent after a long idle spell looks stalled for its own
// latency; Detector, which compares samples, does not.
func StalledNow(d Disk, bound time.Duration) bool {
	return d.InFlight > 0 && d.Idle >= bound
}
