package qemuargs

// Devices only ever added over QMP (device_add, object-add), never on the
// command line: a hot-plugged vCPU and a DIMM with its RAM backend. They
// are typed here like the boot devices so that the QMP arguments have one
// shape.

// CPUSlot is a hot-pluggable vCPU slot's topology, as
// query-hotpluggable-cpus gives it (nil: not part of this machine's
// topology).
type CPUSlot struct {
	NodeID    *int64 `json:"node-id,omitempty"`
	SocketID  *int64 `json:"socket-id,omitempty"`
	DieID     *int64 `json:"die-id,omitempty"`
	ClusterID *int64 `json:"cluster-id,omitempty"`
	CoreID    *int64 `json:"core-id,omitempty"`
	ThreadID  *int64 `json:"thread-id,omitempty"`
}

// CPUDevice is device_add's arguments for one vCPU of driver (the slot's
// type) into slot.
type CPUDevice struct {
	Driver string `json:"driver"`
	ID     string `json:"id"`
	CPUSlot
}

// RAMBackend is object-add's arguments for a DIMM's memory (the same
// shape as the boot memory's backends, MemoryBackend).
type RAMBackend = Object

// DIMMDevice is device_add's arguments for a pc-dimm on a RAM backend.
type DIMMDevice struct {
	Driver string `json:"driver"` // pc-dimm
	ID     string `json:"id"`
	Memdev string `json:"memdev"`
}

// DIMM returns the backend and the device of DIMM id with size bytes; the
// backend is "mem-" + id, placed as the boot memory is (at).
func DIMM(id string, size int64, at MemoryPlace) (RAMBackend, DIMMDevice) {
	mem := "mem-" + id
	return MemoryBackend(mem, size, at), DIMMDevice{Driver: "pc-dimm", ID: id, Memdev: mem}
}
