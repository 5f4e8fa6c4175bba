package iohealth

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

// TestDetector feeds a disk's samples, one a second, and checks the verdict
// after each.
func TestDetector(t *testing.T) {
	type step struct {
		ended, failed uint64
		inFlight      int
		status        qmp.IOStatus
		want          State
	}
	ok := func(ended uint64, inFlight int) step { return step{ended: ended, inFlight: inFlight} }
	stuck := func(ended uint64, want State) step { return step{ended: ended, inFlight: 2, want: want} }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"busy and healthy", []step{ok(1, 1), ok(5, 1), ok(9, 2), ok(14, 1), ok(20, 0), ok(26, 3), ok(30, 1)}},
		{"idle", []step{ok(5, 0), ok(5, 0), ok(5, 0), ok(5, 0), ok(5, 0), ok(5, 0), ok(5, 0), ok(5, 0)}},
		// In flight from the second sample on, nothing ends: counted
		// from the second, stalled once 5 s have passed.
		{"stall", []step{ok(1, 1), stuck(4, OK), stuck(4, OK), stuck(4, OK), stuck(4, OK), stuck(4, OK), stuck(4, Stalled), stuck(4, Stalled)}},
		// Storage back: the first request that ends clears it.
		{"stall and back", []step{ok(1, 1), stuck(4, OK), stuck(4, OK), stuck(4, OK), stuck(4, OK), stuck(4, OK), stuck(4, Stalled), stuck(4, Stalled), ok(9, 1), ok(12, 0)}},
		// A request after a long idle spell that takes a few seconds is
		// slow, not stalled: it is counted from when it was first seen.
		{"slow request after idle", []step{ok(5, 0), ok(5, 0), ok(5, 0), stuck(5, OK), stuck(5, OK), stuck(5, OK), ok(6, 0)}},
		{"requests fail", []step{ok(1, 0), {ended: 3, failed: 2, want: Failing}, {ended: 3, failed: 2, want: Failing}, {ended: 9, failed: 2, want: Failing},
			{ended: 12, failed: 2, want: Failing}, {ended: 14, failed: 2, want: Failing}, {ended: 20, failed: 2, want: OK}}},
		{"stopped by an I/O error", []step{ok(1, 0), {ended: 2, failed: 1, status: qmp.IOStatusFailed, want: Failing}}},
		// QEMU restarted (counters back to zero): a fresh start, no stall.
		{"new QEMU", []step{ok(100, 0), stuck(3, OK), stuck(3, OK)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d Detector
			t0 := time.Unix(1000, 0)
			for i, s := range tc.steps {
				h := d.Observe(Sample{At: t0.Add(time.Duration(i) * time.Second),
					Disks: []Disk{{Name: "data", Ended: s.ended, Failed: s.failed, InFlight: s.inFlight, Idle: -1, IOStatus: s.status}}})
				if h.State != s.want {
					t.Fatalf("sample %d (%+v): %v %q; want %v", i, s, h.State, h.Reason, s.want)
				}
				if h.State != OK && !strings.HasPrefix(h.Reason, "disk data: ") {
					t.Errorf("reason %q does not name the disk", h.Reason)
				}
			}
		})
	}
}

// TestWorstDisk: the VM's health is its worst disk's.
func TestWorstDisk(t *testing.T) {
	var d Detector
	t0 := time.Unix(1000, 0)
	var h Health
	for i := range 8 {
		h = d.Observe(Sample{At: t0.Add(time.Duration(i) * time.Second), Disks: []Disk{
			{Name: "a", Ended: uint64(10 * i), InFlight: 1},
			{Name: "b", Ended: 3, InFlight: 1},
		}})
	}
	if h.State != Stalled || h.Disk != "b" || !h.Since.Equal(t0) || h.Reason != "disk b: requests in flight, none ended since "+t0.UTC().Format("15:04:05Z")+" (storage unreachable?)" {
		t.Fatalf("%+v; want disk b stalled since the first sample (in flight then)", h)
	}
}

// fakeMonitor answers the queries from fixed values.
type fakeMonitor struct {
	stats  []qmp.BlockStats
	block  []qmp.BlockInfo
	queues map[string][]int // device path -> inuse per queue
}

func (f fakeMonitor) QueryBlockstats(context.Context) ([]qmp.BlockStats, error) { return f.stats, nil }
func (f fakeMonitor) QueryBlock(context.Context) ([]qmp.BlockInfo, error)       { return f.block, nil }
func (f fakeMonitor) QueryVirtioStatus(_ context.Context, path string) (qmp.VirtioStatus, error) {
	q, ok := f.queues[path]
	if !ok {
		return qmp.VirtioStatus{}, &qmp.Error{Class: qmp.ClassGenericError, Desc: "no such device"}
	}
	return qmp.VirtioStatus{Name: "virtio-blk", NumVQs: len(q)}, nil
}
func (f fakeMonitor) QueryVirtQueueStatus(_ context.Context, path string, queue int) (qmp.VirtQueueStatus, error) {
	return qmp.VirtQueueStatus{Index: queue, InUse: f.queues[path][queue]}, nil
}

func TestRead(t *testing.T) {
	idle := int64(7 * time.Second)
	var root, data, cd qmp.BlockStats
	root.QdevID = "/machine/peripheral/disk-root/virtio-backend"
	root.Stats.ReadOps, root.Stats.WriteOps, root.Stats.FlushOps, root.Stats.FailedWriteOps = 10, 5, 2, 1
	root.Stats.IdleTimeNanos = &idle
	data.QdevID = "/machine/peripheral/disk-data/virtio-backend"
	cd.QdevID = "/machine/peripheral/disk-cd" // not virtio-blk: in flight unknown
	m := fakeMonitor{
		stats:  []qmp.BlockStats{root, data, cd, {QdevID: "/machine/peripheral/nic0"}},
		block:  []qmp.BlockInfo{{QdevID: root.QdevID, IOStatus: qmp.IOStatusOK}, {QdevID: data.QdevID, IOStatus: qmp.IOStatusNoSpace}},
		queues: map[string][]int{root.QdevID: {1, 2}, data.QdevID: {0}},
	}
	s, err := Read(t.Context(), m)
	if err != nil {
		t.Fatal(err)
	}
	want := []Disk{
		{Name: "cd", InFlight: -1, Idle: -1},
		{Name: "data", Idle: -1, IOStatus: qmp.IOStatusNoSpace},
		{Name: "root", Ended: 18, Failed: 1, InFlight: 3, Idle: 7 * time.Second, IOStatus: qmp.IOStatusOK},
	}
	if len(s.Disks) != len(want) {
		t.Fatalf("%+v; want %+v", s.Disks, want)
	}
	for i := range want {
		if s.Disks[i] != want[i] {
			t.Errorf("disk %d: %+v; want %+v", i, s.Disks[i], want[i])
		}
	}
	if !StalledNow(s.Disks[2], 5*time.Second) || StalledNow(s.Disks[2], 10*time.Second) || StalledNow(s.Disks[0], 0) {
		t.Errorf("StalledNow: want root stalled past 5 s, not 10 s; cd (unknown in flight) never")
	}
}
