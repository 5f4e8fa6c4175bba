package spec

import (
	"fmt"
	"math"
	"math/bits"
)

// Tuning that libvirt users bring along: shared I/O threads, virtio queue
// counts and sizes, the event index, a NIC's queue sizes and send buffer,
// and the RNG's rate limit. Every key defaults to QEMU's own behaviour.

// Tuning limits: QEMU's where it has one (VIRTQUEUE_MAX_SIZE 1024,
// virtio-net's 256..1024 queues), vmsup's where it has none.
const (
	MaxIOThreads     = 64
	MaxDiskQueues    = 256
	MaxDiskQueueSize = 1024
	MinNICQueueSize  = 256
	MaxNICQueueSize  = 1024
	// MaxNICTxQueueSize is what virtio-net takes for its TX queue with the
	// backends vmsup gives it (tap, user-mode; 1024 is vhost-user's and
	// vDPA's): QEMU 7.2 silently uses 256 instead of more, QEMU 10 refuses
	// to start.
	MaxNICTxQueueSize = 256
	// MaxRNGPeriod is QEMU's period limit (milliseconds in a uint32).
	MaxRNGPeriod = Duration(math.MaxUint32) * Duration(1e6)
)

// RNGRate limits the guest's RNG to Bytes per Period (QEMU's virtio-rng
// max-bytes and period); zero Bytes is no limit.
type RNGRate struct {
	Bytes  int64    `toml:"bytes"`
	Period Duration `toml:"period"` // default "1s" with bytes (libvirt's default)
}

// DefaultRNGPeriod is the period of a rate without one.
const DefaultRNGPeriod = Duration(1e9)

// Limited reports whether the RNG is rate-limited.
func (r RNGRate) Limited() bool { return r.Bytes > 0 }

// EffectivePeriod is the period, its default when unset.
func (r RNGRate) EffectivePeriod() Duration {
	if r.Period == 0 {
		return DefaultRNGPeriod
	}
	return r.Period
}

func powerOf2(n int) bool { return n > 0 && bits.OnesCount(uint(n)) == 1 }

// validateTuning: the VM's I/O threads and RNG rate.
func (f *File) validateTuning() error {
	vm := &f.VM
	if vm.IOThreads < 0 || vm.IOThreads > MaxIOThreads {
		return f.Errorf("iothreads", "%d is out of range 0..%d", vm.IOThreads, MaxIOThreads)
	}
	r := vm.RNGRate
	switch {
	case r.Bytes < 0:
		return f.Errorf("rng_rate.bytes", "must not be negative")
	case r.Period < 0 || r.Period > MaxRNGPeriod || r.Period%Duration(1e6) != 0:
		return f.Errorf("rng_rate.period", "%s: a whole number of milliseconds, at most %s", r.Period.D(), MaxRNGPeriod.D())
	case r.Period != 0 && r.Bytes == 0:
		return f.Errorf("rng_rate.period", "a period needs bytes (the limit per period)")
	case r.Limited() && !vm.HasRNG():
		return f.Errorf("rng_rate", "needs the RNG device (rng = false)")
	}
	for i, d := range vm.Disks {
		if d.IOThreadID > vm.IOThreads {
			return f.Errorf(fmt.Sprintf("disk[%d].iothread_id", i), "%d: the VM has %d shared I/O threads (iothreads)", d.IOThreadID, vm.IOThreads)
		}
		if err := d.checkIOThreadMap(vm.IOThreads); err != nil {
			return f.Errorf(fmt.Sprintf("disk[%d].iothread_map", i), "%v", err)
		}
	}
	return nil
}

// IOThreadQueues is one entry of a disk's iothread_map: a shared I/O
// thread (1..iothreads) and the virtio queues it serves; no queues in
// every entry: QEMU deals them out round-robin.
type IOThreadQueues struct {
	Thread int   `toml:"thread"`
	Queues []int `toml:"queues,omitempty"`
}

// checkIOThreadMap: the threads exist, each once; queues are given in
// every entry or in none (QEMU refuses a mix), each queue once and below
// the disk's queue count when it sets one.
func (d *Disk) checkIOThreadMap(threads int) error {
	if len(d.IOThreadMap) == 0 {
		return nil
	}
	switch {
	case d.IOThread || d.IOThreadID > 0:
		return fmt.Errorf("give iothread_map or iothread/iothread_id, not both")
	case d.Bus != "" && d.Bus != BusVirtio || d.IsCDROM():
		return fmt.Errorf("applies to bus \"virtio\" (virtio-blk) only")
	}
	seenThread, seenQueue := map[int]bool{}, map[int]bool{}
	withQueues := len(d.IOThreadMap[0].Queues) > 0
	if withQueues && d.Queues == 0 {
		return fmt.Errorf("a map that names queues needs the disk's queues (QEMU's default follows the vCPUs)")
	}
	for _, e := range d.IOThreadMap {
		switch {
		case e.Thread < 1 || e.Thread > threads:
			return fmt.Errorf("thread %d: the VM has %d shared I/O threads (iothreads)", e.Thread, threads)
		case seenThread[e.Thread]:
			return fmt.Errorf("thread %d is listed twice", e.Thread)
		case (len(e.Queues) > 0) != withQueues:
			return fmt.Errorf("give queues for every thread or for none (QEMU then deals them out round-robin)")
		}
		seenThread[e.Thread] = true
		for _, q := range e.Queues {
			switch {
			case q < 0 || q >= d.Queues:
				return fmt.Errorf("queue %d: the disk has queues 0..%d", q, d.Queues-1)
			case seenQueue[q]:
				return fmt.Errorf("queue %d is mapped twice", q)
			}
			seenQueue[q] = true
		}
	}
	if withQueues && len(seenQueue) != d.Queues {
		return fmt.Errorf("%d of the disk's %d queues are mapped: map every queue", len(seenQueue), d.Queues)
	}
	return nil
}

// diskTuning: a disk's I/O thread, queues and event index fit its bus.
func diskTuning(d *Disk, fail diskFail) error {
	switch {
	case d.IOThreadID < 0:
		return fail("iothread_id", "must not be negative")
	case d.IOThreadID > 0 && d.IOThread:
		return fail("iothread_id", "give iothread (a thread of the disk's own) or iothread_id (a shared one), not both")
	case d.IOThreadID > 0 && (d.Bus == BusSATA || d.IsCDROM()):
		return fail("iothread_id", "a SATA disk or a CD-ROM has no I/O thread")
	case d.Queues < 0 || d.Queues > MaxDiskQueues:
		return fail("queues", "%d is out of range 0..%d", d.Queues, MaxDiskQueues)
	case d.Queues > 0 && d.Bus == BusSATA:
		return fail("queues", "a SATA disk has no virtio queues")
	case d.QueueSize != 0 && (!powerOf2(d.QueueSize) || d.QueueSize < 4 || d.QueueSize > MaxDiskQueueSize):
		return fail("queue_size", "%d is not a power of 2 from 4 to %d", d.QueueSize, MaxDiskQueueSize)
	case d.QueueSize != 0 && d.Bus != BusVirtio:
		return fail("queue_size", "applies to bus \"virtio\" (virtio-blk) only")
	case d.EventIdx != nil && d.Bus == BusSATA:
		return fail("event_idx", "a SATA disk is not a virtio device")
	}
	return nil
}

// nicTuning: a NIC's queue sizes and send buffer.
func (n *NIC) nicTuning() (string, error) {
	for _, q := range []struct {
		key string
		v   int
	}{{"rx_queue_size", n.RxQueueSize}, {"tx_queue_size", n.TxQueueSize}} {
		if q.v != 0 && (!powerOf2(q.v) || q.v < MinNICQueueSize || q.v > MaxNICQueueSize) {
			return q.key, fmt.Errorf("%d is not a power of 2 from %d to %d", q.v, MinNICQueueSize, MaxNICQueueSize)
		}
	}
	if n.TxQueueSize > MaxNICTxQueueSize {
		return "tx_queue_size", fmt.Errorf("%d: QEMU takes at most %d with a tap or user-mode backend (QEMU 7.2 silently uses %d, QEMU 10 refuses to start)",
			n.TxQueueSize, MaxNICTxQueueSize, MaxNICTxQueueSize)
	}
	switch {
	case n.SndBuf < 0:
		return "sndbuf", fmt.Errorf("must not be negative")
	case n.SndBuf > 0 && !n.UsesTap():
		return "sndbuf", fmt.Errorf("needs a tap NIC (type bridge, ovs or cni)")
	}
	return "", nil
}
