package spec

// Vsock is a virtio vsock device (vhost-vsock-pci): host<->guest sockets
// addressed by the guest's context id (CID), with no network in between.
type Vsock struct {
	Enabled bool `toml:"enabled"`
	// CID is the guest's fixed context id; 0 (the default) lets vmsup pick
	// the lowest free one at the first start and keep it until vmsup rm.
	// 0-2 are the hypervisor, the local loopback and the host; 2^32-1 is
	// VMADDR_CID_ANY.
	CID int64 `toml:"cid"`
}

// Vsock CID bounds.
const (
	MinVsockCID = 3
	MaxVsockCID = 1<<32 - 2
)

// On reports whether the VM has a vsock device.
func (v Vsock) On() bool { return v.Enabled }

func (f *File) validateVsock() error {
	v := f.VM.Vsock
	if v.CID != 0 && !v.Enabled {
		return f.Errorf("vsock.cid", "a CID needs the device: enabled = true")
	}
	if v.CID != 0 && (v.CID < MinVsockCID || v.CID > MaxVsockCID) {
		return f.Errorf("vsock.cid", "%d is out of range %d..%d (0-2 are the hypervisor, loopback and host; %d is \"any\")",
			v.CID, MinVsockCID, MaxVsockCID, int64(MaxVsockCID)+1)
	}
	return nil
}
