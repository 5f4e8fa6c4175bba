package spec

import (
	"fmt"
	"path/filepath"
	"regexp"
)

// TPM is an emulated TPM 2.0: swtpm in a companion unit of the VM's,
// with its state kept in the VM's state directory (over down/up and
// migrations).
type TPM struct {
	// Model is the guest's interface: "crb" (default: the TPM 2.0 command
	// response buffer) or "tis" (the older FIFO interface some guests want).
	Model string `toml:"model"`
}

// TPM models.
const (
	TPMCRB = "crb"
	TPMTIS = "tis"
)

// Share is a host folder the guest mounts by its tag.
type Share struct {
	Path     string `toml:"path" vmsup:"hostpath"` // required: a host directory; relative paths are relative to the TOML file
	Tag      string `toml:"tag"`                   // required: the guest's mount tag (mount -t 9p TAG /mnt)
	ReadOnly bool   `toml:"read_only"`             // the guest cannot change anything in it
	// Driver is "9p" (default: virtio-9p, inside QEMU) or "virtiofs" (a
	// virtiofsd in a companion unit; the guest mounts -t virtiofs TAG).
	Driver string `toml:"driver"`
}

// Share drivers.
const (
	Share9P       = "9p"
	ShareVirtioFS = "virtiofs"
)

// VirtioFSQueueSize is a virtiofs share's request queue size (libvirt's
// and virtiofsd's documented choice; QEMU's default 128 limits throughput).
const VirtioFSQueueSize = 1024

// MaxShares bounds [[share]]: 9p shares are functions of the platform
// slot, which has 8 (see qemuargs).
const MaxShares = 4

// MaxShareTag is the longest mount tag (QEMU's virtio-9p limit).
const MaxShareTag = 31

var tagRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

func (vm *VM) guestDevDefaults() {
	if vm.TPM != nil && vm.TPM.Model == "" {
		vm.TPM.Model = TPMCRB
	}
	for i := range vm.Shares {
		if vm.Shares[i].Driver == "" {
			vm.Shares[i].Driver = Share9P
		}
	}
}

func (f *File) validateGuestDevs() error {
	vm := &f.VM
	if b := vm.Boot; b.SecureBoot || b.VarsTemplate != "" {
		field := "boot.secure_boot"
		if !b.SecureBoot {
			field = "boot.vars_template"
		}
		if b.Firmware != FirmwareUEFI {
			return f.Errorf(field, "needs firmware \"uefi\"")
		}
		if b.SecureBoot && !vm.Q35() {
			return f.Errorf(field, "needs machine \"q35\" (Secure Boot's firmware needs SMM)")
		}
	}
	if vm.TPM != nil && vm.TPM.Model != TPMCRB && vm.TPM.Model != TPMTIS {
		return f.Errorf("tpm.model", "%q is not \"crb\" or \"tis\"", vm.TPM.Model)
	}
	if len(vm.Shares) > MaxShares {
		return f.Errorf(fmt.Sprintf("share[%d]", MaxShares), "more than %d shares", MaxShares)
	}
	tags := map[string]int{}
	for i, s := range vm.Shares {
		field := fmt.Sprintf("share[%d]", i)
		switch {
		case s.Path == "":
			return f.Errorf(field+".path", "missing (the host folder to share)")
		case !filepath.IsAbs(s.Path):
			return f.Errorf(field+".path", "%q must be absolute", s.Path)
		case s.Path == "/":
			return f.Errorf(field+".path", "the host's root cannot be shared")
		case s.Tag == "":
			return f.Errorf(field+".tag", "missing (the guest mounts the share by it)")
		case len(s.Tag) > MaxShareTag || !tagRE.MatchString(s.Tag):
			return f.Errorf(field+".tag", "%q: at most %d letters, digits, '_', '.', '-'", s.Tag, MaxShareTag)
		case s.Driver != Share9P && s.Driver != ShareVirtioFS:
			return f.Errorf(field+".driver", "%q is not \"9p\" or \"virtiofs\"", s.Driver)
		}
		if j, dup := tags[s.Tag]; dup {
			return f.Errorf(field+".tag", "duplicate tag %q (also share[%d])", s.Tag, j)
		}
		tags[s.Tag] = i
	}
	return nil
}

// HasVirtioFS reports whether a share needs virtiofsd (and with it
// guest memory QEMU shares with it).
func (vm *VM) HasVirtioFS() bool {
	for _, s := range vm.Shares {
		if s.Driver == ShareVirtioFS {
			return true
		}
	}
	return false
}
