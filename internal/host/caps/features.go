package caps

import (
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// CheckFeatures refuses what the spec asks of QEMU that this QEMU's
// version does not have, naming the field, before QEMU stops at start with
// a property error. A record without a version (a test's) passes.
func (c *Caps) CheckFeatures(f *spec.File) error {
	v := c.QEMU.Version
	if v == "" {
		return nil
	}
	for i, d := range f.VM.Disks {
		if len(d.IOThreadMap) > 0 && !versionAtLeast(v, 9, 0) {
			return f.Errorf(fmt.Sprintf("disk[%d].iothread_map", i), "needs QEMU 9.0 or newer (virtio-blk's iothread-vq-mapping); QEMU here is %s: use iothread_id", v)
		}
	}
	return nil
}

// IOThreadVQMapping reports whether this QEMU spreads a virtio-blk disk's
// queues over several I/O threads (9.0 and newer).
func (c *Caps) IOThreadVQMapping() bool { return versionAtLeast(c.QEMU.Version, 9, 0) }
