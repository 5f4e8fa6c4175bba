package spec

import (
	"strings"
	"testing"
)

// TestTuning: the tuning keys take QEMU's ranges, each error naming its key.
func TestTuning(t *testing.T) {
	const head = "name = \"t\"\nmemory = \"512M\"\n"
	const disk = "[[disk]]\nname = \"d\"\nfile = \"/d.img\"\n"
	for _, c := range []struct{ body, want string }{
		{"iothreads = 2\n" + disk + "iothread_id = 2\nqueues = 4\nqueue_size = 256\nevent_idx = false\n", ""},
		{"iothreads = 65\n" + disk, "iothreads: 65 is out of range 0..64"},
		{"iothreads = 1\n" + disk + "iothread_id = 2\n", "disk[0].iothread_id: 2: the VM has 1 shared I/O threads"},
		{"iothreads = 1\n" + disk + "iothread_id = 1\niothread = true\n", "disk[0].iothread_id: give iothread"},
		{disk + "queue_size = 100\n", "disk[0].queue_size: 100 is not a power of 2"},
		{disk + "queue_size = 128\nbus = \"scsi\"\n", "disk[0].queue_size: applies to bus \"virtio\""},
		{disk + "queues = 2\nbus = \"sata\"\n", "disk[0].queues: a SATA disk has no virtio queues"},
		{disk + "event_idx = true\nbus = \"sata\"\n", "disk[0].event_idx: a SATA disk is not a virtio device"},
		{"iothreads = 2\n" + disk + "queues = 4\niothread_map = [{ thread = 1, queues = [0, 2] }, { thread = 2, queues = [1, 3] }]\n", ""},
		{"iothreads = 2\n" + disk + "iothread_map = [{ thread = 1 }, { thread = 2 }]\n", ""},
		{"iothreads = 1\n" + disk + "iothread_map = [{ thread = 2 }]\n", "disk[0].iothread_map: thread 2: the VM has 1 shared I/O threads"},
		{"iothreads = 2\n" + disk + "iothread_map = [{ thread = 1 }, { thread = 1 }]\n", "disk[0].iothread_map: thread 1 is listed twice"},
		{"iothreads = 2\n" + disk + "queues = 2\niothread_map = [{ thread = 1, queues = [0] }, { thread = 2 }]\n", "give queues for every thread or for none"},
		{"iothreads = 2\n" + disk + "iothread_map = [{ thread = 1, queues = [0] }]\n", "needs the disk's queues"},
		{"iothreads = 2\n" + disk + "queues = 2\niothread_map = [{ thread = 1, queues = [0, 2] }]\n", "queue 2: the disk has queues 0..1"},
		{"iothreads = 2\n" + disk + "queues = 2\niothread_map = [{ thread = 1, queues = [0] }, { thread = 2, queues = [0] }]\n", "queue 0 is mapped twice"},
		{"iothreads = 2\n" + disk + "queues = 3\niothread_map = [{ thread = 1, queues = [0] }, { thread = 2, queues = [1] }]\n", "2 of the disk's 3 queues are mapped"},
		{"iothreads = 2\n" + disk + "iothread_id = 1\niothread_map = [{ thread = 2 }]\n", "give iothread_map or iothread/iothread_id"},
		{"iothreads = 2\n" + disk + "bus = \"scsi\"\niothread_map = [{ thread = 2 }]\n", "disk[0].iothread_map: applies to bus \"virtio\""},
		{"rng_rate = { bytes = 100, period = \"2s\" }\n" + disk, ""},
		{"rng = false\nrng_rate = { bytes = 100 }\n" + disk, "rng_rate: needs the RNG device"},
		{"rng_rate = { period = \"2s\" }\n" + disk, "rng_rate.period: a period needs bytes"},
		{"rng_rate = { bytes = 1, period = \"1500us\" }\n" + disk, "rng_rate.period: 1.5ms: a whole number of milliseconds"},
		{disk + "[[nic]]\nname = \"n\"\ntype = \"bridge\"\nbridge = \"br0\"\nrx_queue_size = 512\ntx_queue_size = 256\nsndbuf = \"1M\"\n", ""},
		{disk + "[[nic]]\nname = \"n\"\nrx_queue_size = 128\n", "nic[0].rx_queue_size: nic \"n\": 128 is not a power of 2 from 256 to 1024"},
		{disk + "[[nic]]\nname = \"n\"\nsndbuf = \"1M\"\n", "nic[0].sndbuf: nic \"n\": needs a tap NIC"},
		{disk + "[[nic]]\nname = \"n\"\ntx_queue_size = 1024\n", "nic[0].tx_queue_size: nic \"n\": 1024: QEMU takes at most 256 with a tap or user-mode backend"},
		{disk + "[sev]\npolicy = 3\ncbitpos = 47\nreduced_phys_bits = 1\n", ""},
		{disk + "[sev]\ncbitpos = 7\nreduced_phys_bits = 1\n", "sev.cbitpos: 7 is out of range 32..63"},
		{"accel = \"tcg\"\n" + disk + "[sev]\ncbitpos = 47\nreduced_phys_bits = 1\n", "sev: memory encryption needs accel \"kvm\""},
	} {
		_, err := Parse("/t.toml", []byte(head+c.body))
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want %q", c.body, err, c.want)
		}
	}
}
