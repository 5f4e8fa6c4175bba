package qemuargs

import (
	"cmp"
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// DefaultRAMID is the name QEMU gives the -m memory's backend when none is
// named (q35 and pc: "pc.ram"), and so the name of its RAM block in a
// migration stream. vmsup's shared backend (Options.ShareRAM) takes the
// same name: a VM moves between a QEMU that shares its memory and one that
// does not (QEMU 7.2 and 10 alike), and a VM started before vmsup shared
// it migrates into one that does.
const DefaultRAMID = "pc.ram"

// RAM is how a QEMU holds the guest's memory, as the VM's record keeps it:
// what both sides of a migration must agree on, and whether a new QEMU can
// take the memory over in place.
type RAM struct {
	// ID names the -m memory's RAM block: DefaultRAMID (QEMU's own backend,
	// or vmsup's shared one of that name), MainMemdevID (hugepages or
	// virtiofs, which have had a backend of their own since before
	// ShareRAM); "" for a VM with NUMA nodes (NUMAMemdevID each).
	ID string `json:"id,omitempty"`
	// Shared: all of it is shared memory (ShareRAM took effect): the -m
	// memory or the nodes' memory-backend-memfd share=on, and the
	// machine's other RAM with aux-ram-share=on. QEMU 10's cpr-transfer
	// hands such memory to a new QEMU in place.
	Shared bool `json:"shared,omitempty"`
}

// RAMOf is how Build(vm, o) holds the guest's memory.
func RAMOf(vm *spec.VM, o Options) RAM {
	r := RAM{Shared: sharesRAM(vm, o)}
	if len(vm.NUMA) > 0 {
		return r
	}
	id := DefaultRAMID
	if vm.Hugepages != "" || vm.HasVirtioFS() {
		id = MainMemdevID
	}
	r.ID = cmp.Or(o.RAMID, id)
	return r
}

// sharesRAM: Options.ShareRAM takes effect unless the spec keeps the
// memory private (shared_memory = false), or it is on hugepages (a private
// hugetlbfs mapping reserves its pages when QEMU maps it) or encrypted by
// SEV (its pages are the guest's, not another QEMU's to map).
func sharesRAM(vm *spec.VM, o Options) bool {
	return o.ShareRAM && vm.ShareableMemory()
}

// mainRAMBackend is the -m memory's backend object, or "" when QEMU's own
// (memory-backend-ram named DefaultRAMID) is the VM's: without hugepages,
// shared memory or another name to keep.
func mainRAMBackend(vm *spec.VM, o Options) (Object, bool) {
	ram, at := RAMOf(vm, o), memoryPlace(vm, o)
	if ram.ID == "" || at == (MemoryPlace{}) && ram.ID == DefaultRAMID {
		return Object{}, false
	}
	obj := MemoryBackend(ram.ID, int64(vm.Memory), at)
	if ram.ID == DefaultRAMID {
		// The block's name is the backend's id, not its QOM path, whatever
		// the machine type (before pc-*-4.0 QEMU used the path).
		no := false
		obj.CanonicalRAMID = &no
	}
	return obj, true
}

// cprIncoming is a cpr-transfer destination's second -incoming: the "cpr"
// channel on a unix socket, where QEMU reads the source's state and
// descriptors (its guest RAM) before it creates the machine. The main
// channel stays "defer": QEMU listens for the stream at migrate-incoming,
// and only then closes the cpr channel, which tells the source to connect.
type cprIncoming struct{ Socket string }

func (c cprIncoming) Args() ([]string, error) {
	addr := struct {
		Transport string `json:"transport"`
		Type      string `json:"type"`
		Path      string `json:"path"`
	}{"socket", "unix", c.Socket}
	ch := struct {
		Type string `json:"channel-type"`
		Addr any    `json:"addr"`
	}{"cpr", addr}
	j, err := marshalJSON(ch)
	if err != nil {
		return nil, fmt.Errorf("cpr channel: %w", err)
	}
	return []string{"-incoming", j}, nil
}

// checkCPR checks a cpr-transfer destination's socket: an incoming QEMU's,
// a unix socket path (path checks an absolute one).
func checkCPR(o Options, path func(name, p string) error) error {
	if o.CPRSocket == "" {
		return nil
	}
	if !o.Incoming {
		return errorf("Options.CPRSocket", "a cpr channel is for a migration destination (Options.Incoming)")
	}
	if err := path("CPRSocket", o.CPRSocket); err != nil {
		return err
	}
	if len(o.CPRSocket) > maxSocketPath {
		return errorf("Options.CPRSocket", "%q is longer than %d bytes, the limit for unix socket paths", o.CPRSocket, maxSocketPath)
	}
	return nil
}
