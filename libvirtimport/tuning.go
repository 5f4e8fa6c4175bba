package libvirtimport

import (
	"fmt"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

// I/O threads, virtio queue tuning, the RNG's rate and SEV.

// ioThreads maps the domain's I/O threads to vmsup's shared ones, in the
// domain's order: <iothreadids> names them, else <iothreads> counts them
// (ids 1..N). QEMU's object ids are vmsup's; the guest sees no difference.
func (c *converter) ioThreads() {
	d := c.dom
	c.iothreads = map[uint]int{}
	if d.IOThreadIDs != nil {
		for _, t := range d.IOThreadIDs.IOThreads {
			if _, dup := c.iothreads[t.ID]; !dup {
				c.iothreads[t.ID] = len(c.iothreads) + 1
			}
		}
	}
	for id := uint(1); len(c.iothreads) < int(d.IOThreads); id++ {
		if _, dup := c.iothreads[id]; !dup {
			c.iothreads[id] = len(c.iothreads) + 1
		}
	}
	if n := len(c.iothreads); n > spec.MaxIOThreads {
		c.drop("iothreads", "%d I/O threads: vmsup makes at most %d; the disks keep threads of their own", n, spec.MaxIOThreads)
		c.iothreads = map[uint]int{}
	}
	c.out.IOThreads = len(c.iothreads)
}

// ioThreadMap carries a disk's queue mapping over the domain's I/O
// threads as iothread_map where this host's QEMU has iothread-vq-mapping
// and every thread is one of the domain's; else it lists it as dropped.
func (m *diskMapper) ioThreadMap(threads []libvirtxml.DomainDiskIOThread) bool {
	first := threads[0].ID
	if !m.c.vqMapping {
		m.dropAt("driver/iothreads", "queues mapped to %d I/O threads need QEMU 9 (iothread-vq-mapping): the disk runs in thread %d", len(threads), first)
		return false
	}
	var out []spec.IOThreadQueues
	for _, t := range threads {
		n, ok := m.c.iothreads[t.ID]
		if !ok {
			m.dropAt("driver/iothreads", "thread %d is not one of the domain's I/O threads: the disk runs in thread %d", t.ID, first)
			return false
		}
		e := spec.IOThreadQueues{Thread: n}
		for _, q := range t.Queues {
			e.Queues = append(e.Queues, int(q.ID))
		}
		out = append(out, e)
	}
	m.out.IOThreadMap = out
	return true
}

// diskTuning maps a virtio disk's I/O thread (shared, by id), queues,
// queue size and event index. A per-queue mapping needs QEMU 9's
// iothread-vq-mapping: the disk runs in its first thread.
func (m *diskMapper) diskTuning(dr *libvirtxml.DomainDiskDriver) {
	o := &m.out
	if o.Bus == spec.BusSATA || o.Type == spec.DiskISO || o.Device == spec.DeviceCDROM {
		if dr.IOThread != nil || dr.IOThreads != nil || dr.Queues != nil || dr.QueueSize != nil || dr.EventIDX != "" {
			m.dropAt("driver", "I/O threads and virtio queues: the disk is not a virtio device here")
		}
		return
	}
	id := dr.IOThread
	if t := dr.IOThreads; t != nil && len(t.IOThread) > 0 {
		if m.ioThreadMap(t.IOThread) {
			id = nil
		} else {
			first := t.IOThread[0].ID
			id = &first
		}
	}
	if id != nil {
		if n, ok := m.c.iothreads[*id]; ok {
			o.IOThreadID = n
		} else {
			o.IOThread = true
			m.c.note(m.at("driver/@iothread"), "%d is not one of the domain's I/O threads: the disk gets a thread of its own", *id)
		}
	}
	if dr.Queues != nil && *dr.Queues > 1 {
		o.Queues = *dr.Queues
	}
	if dr.QueueSize != nil {
		if o.Bus == "" || o.Bus == spec.BusVirtio {
			o.QueueSize = *dr.QueueSize
		} else {
			m.dropAt("driver/@queue_size", "%d: vmsup sets a queue size on virtio-blk only", *dr.QueueSize)
		}
	}
	switch dr.EventIDX {
	case "on":
		t := true
		o.EventIdx = &t
	case "off":
		f := false
		o.EventIdx = &f
	}
}

// nicTuning maps virtio-net's queue sizes, TX mode and the tap's send
// buffer.
func (c *converter) nicTuning(el string, in *libvirtxml.DomainInterface, n *fileNIC) {
	if dr := in.Driver; dr != nil {
		n.RxQueueSize, n.TxQueueSize = dr.RXQueueSize, dr.TXQueueSize
		if dr.TXQueueSize > spec.MaxNICTxQueueSize {
			// QEMU 7.2 used 256 under libvirt too; QEMU 10 refuses to start.
			n.TxQueueSize = spec.MaxNICTxQueueSize
			c.note(el+"/driver/@tx_queue_size", "%d: QEMU takes at most %d with a tap backend (7.2 used %d under libvirt too): %d it is",
				dr.TXQueueSize, spec.MaxNICTxQueueSize, spec.MaxNICTxQueueSize, spec.MaxNICTxQueueSize)
		}
		if dr.TXMode == "timer" {
			c.drop(el+"/driver/@txmode", "\"timer\": vmsup's virtio-net transmits from a bottom half (QEMU's default, libvirt's \"iothread\")")
		}
	}
	if t := in.Tune; t != nil && t.SndBuf > 0 {
		if n.Type == spec.NICUser {
			c.drop(el+"/tune/sndbuf", "a send buffer is a tap's: this NIC is user-mode")
		} else {
			n.SndBuf = t.SndBuf
		}
	}
}

// rngRate maps the RNG's rate (libvirt's period defaults to 1 s, as
// vmsup's does).
func (c *converter) rngRate(i int, r *libvirtxml.DomainRNGRate) {
	if r == nil || r.Bytes == 0 {
		return
	}
	c.out.RNGRate = &fileRNGRate{Bytes: r.Bytes}
	if r.Period != 0 && r.Period != 1000 {
		c.out.RNGRate.Period = fmt.Sprintf("%dms", r.Period)
	}
}

// launchSecurity maps SEV. An SEV domain becomes an SEV VM even on a host
// without SEV, which vmsup then refuses to start (never unencrypted).
func (c *converter) launchSecurity() error {
	ls := c.dom.LaunchSecurity
	if ls == nil {
		return nil
	}
	s := ls.SEV
	switch {
	case s == nil:
		return fmt.Errorf("launchSecurity: vmsup has AMD SEV only (not SEV-SNP, TDX or s390 PV), and will not make this VM one that runs unencrypted")
	case s.CBitPos == nil || s.ReducedPhysBits == nil || s.Policy == nil:
		return fmt.Errorf("launchSecurity: SEV needs cbitpos, reducedPhysBits and policy (virsh domcapabilities prints the host's)")
	}
	c.out.SEV = &fileSEV{Policy: *s.Policy, CBitPos: *s.CBitPos, ReducedPhysBits: *s.ReducedPhysBits}
	if s.KernelHashes == "yes" {
		c.drop("launchSecurity/@kernelHashes", "vmsup does not measure the kernel into the launch digest")
	}
	if c.noSEV != "" {
		c.note("launchSecurity", "carried over as [sev], but this host cannot run SEV guests (%s): vmsup refuses to start the VM here rather than run it unencrypted", c.noSEV)
	}
	return nil
}
