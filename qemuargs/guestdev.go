package qemuargs

import (
	"fmt"
	"path/filepath"

	"github.com/vmsup/vmsup/spec"
)

// Guest devices backed by something outside QEMU or the disk/NIC model:
// the TPM (swtpm's control socket) and shared folders (a host directory
// QEMU serves over virtio-9p, or virtiofsd over vhost-user).

// IDs of the TPM's parts.
const (
	TPMChardevID = "tpm-chr"
	TPMBackendID = "tpm0"
	TPMDeviceID  = "tpm"
)

// ShareFSDevID is the -fsdev id of the i-th share, ShareDeviceID its
// device's.
func ShareFSDevID(i int) string  { return fmt.Sprintf("share%d", i) }
func ShareDeviceID(i int) string { return fmt.Sprintf("share%d-dev", i) }

// ShareChardevID is the vhost-user chardev of the i-th share (virtiofs).
func ShareChardevID(i int) string { return fmt.Sprintf("share%d-chr", i) }

// tpmParts: QEMU is the client of swtpm's control socket (swtpm listens
// before QEMU starts; with --terminate it ends when QEMU lets go).
func tpmParts(vm *spec.VM, o Options) ([]renderer, error) {
	if vm.TPM == nil {
		return nil, nil
	}
	p, err := escapeValue(o.TPMSocket)
	if err != nil {
		return nil, errorf("Options.TPMSocket", "%v", err)
	}
	driver := "tpm-crb"
	if vm.TPM.Model == spec.TPMTIS {
		driver = "tpm-tis"
	}
	return []renderer{
		flags{"-chardev", "socket,id=" + TPMChardevID + ",path=" + p},
		flags{"-tpmdev", "emulator,id=" + TPMBackendID + ",chardev=" + TPMChardevID},
		Device{Driver: driver, ID: TPMDeviceID, TPMDev: TPMBackendID}, // sysbus (crb) or ISA (tis): no PCI slot
	}, nil
}

// share9P is a virtio-9p share: -fsdev local with security_model=none, so
// the files the guest makes are plain files of QEMU's user on the host
// (mapped-xattr would make them 0600 and unreadable to the host's users;
// passthrough needs root to chown).
type share9P struct {
	ID, Path string
	ReadOnly bool
}

func (s share9P) Args() ([]string, error) {
	p, err := escapeValue(s.Path)
	if err != nil {
		return nil, fmt.Errorf("fsdev %q path: %w", s.ID, err)
	}
	v := "local,id=" + s.ID + ",path=" + p + ",security_model=none"
	if s.ReadOnly {
		v += ",readonly=on"
	}
	return []string{"-fsdev", v}, nil
}

// shareBackends are the shares' backends: a 9p fsdev, or the client end
// of virtiofsd's vhost-user socket (o.ShareSockets, by tag). Their devices
// are functions of the platform slot (slotDevices), after the platform's
// own, so no disk or NIC moves when a share is added.
func shareBackends(vm *spec.VM, o Options) ([]renderer, error) {
	var out []renderer
	for i, s := range vm.Shares {
		if s.Driver == spec.Share9P {
			out = append(out, share9P{ShareFSDevID(i), s.Path, s.ReadOnly})
			continue
		}
		sock := o.ShareSockets[s.Tag]
		if sock == "" || !filepath.IsAbs(sock) {
			return nil, errorf(fmt.Sprintf("share[%d]", i), "virtiofs needs Options.ShareSockets[%q], virtiofsd's socket (absolute)", s.Tag)
		}
		p, err := escapeValue(sock)
		if err != nil {
			return nil, errorf(fmt.Sprintf("share[%d]", i), "%v", err)
		}
		out = append(out, flags{"-chardev", "socket,id=" + ShareChardevID(i) + ",path=" + p})
	}
	return out, nil
}

// shareDevices are the shares' PCI functions.
func shareDevices(vm *spec.VM) []Device {
	var out []Device
	for i, s := range vm.Shares {
		if s.Driver == spec.Share9P {
			out = append(out, Device{Driver: "virtio-9p-pci", ID: ShareDeviceID(i), FSDev: ShareFSDevID(i), MountTag: s.Tag})
			continue
		}
		out = append(out, Device{Driver: "vhost-user-fs-pci", ID: ShareDeviceID(i), Chardev: ShareChardevID(i),
			Tag: s.Tag, QueueSize: spec.VirtioFSQueueSize})
	}
	return out
}
