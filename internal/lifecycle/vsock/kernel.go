package vsock

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vhostVsockSetGuestCID is VHOST_VSOCK_SET_GUEST_CID, _IOW(VHOST_VIRTIO
// 0xAF, 0x60, __u64) from linux/vhost.h (x/sys/unix does not have it).
const vhostVsockSetGuestCID = 0x4008af60

// Device is the vhost-vsock device QEMU's vhost-vsock-pci opens.
const Device = "/dev/vhost-vsock"

// KernelInUse returns an InUse that asks the kernel through dev
// (/dev/vhost-vsock): it sets the CID on a fresh fd, which the kernel
// refuses (EADDRINUSE) while another vhost-vsock fd, of any program, holds
// it, and closes the fd, which frees the CID again. See the package
// documentation for why this is a check and not a hold.
func KernelInUse(dev string) func(cid uint32) (bool, error) {
	return func(cid uint32) (bool, error) {
		f, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return false, err
		}
		defer f.Close()
		v := uint64(cid)
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), vhostVsockSetGuestCID, uintptr(unsafe.Pointer(&v)))
		switch {
		case errno == 0:
			return false, nil
		case errors.Is(errno, unix.EADDRINUSE):
			return true, nil
		}
		return false, &os.PathError{Op: "VHOST_VSOCK_SET_GUEST_CID", Path: dev, Err: errno}
	}
}
