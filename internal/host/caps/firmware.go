package caps

import (
	"os"

	"github.com/vmsup/vmsup/spec"
)

// Firmware files of Debian's ovmf and qemu-system-data packages, first
// found first.
func firmwareCandidates(kind string) []string {
	switch kind {
	case "ovmf-code":
		return []string{"/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_CODE.fd"}
	case "ovmf-vars":
		return []string{"/usr/share/OVMF/OVMF_VARS_4M.fd", "/usr/share/OVMF/OVMF_VARS.fd"}
	case "ovmf-code-secboot": // aborts without SMM, so the variable store stays the firmware's own
		return []string{"/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"}
	case "ovmf-vars-ms": // Microsoft's keys enrolled, Secure Boot on
		return []string{"/usr/share/OVMF/OVMF_VARS_4M.ms.fd"}
	case "qboot":
		return []string{"/usr/share/qemu/qboot.rom"}
	}
	return nil
}

func firstExisting(paths []string) string {
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// FirmwareCode is the code image QEMU runs for the spec's firmware: OVMF for
// "uefi", the qboot ROM for "qboot"; "" for "bios" (QEMU's own SeaBIOS) or
// when the package is not installed.
func FirmwareCode(firmware string) string {
	switch firmware {
	case spec.FirmwareUEFI:
		return firstExisting(firmwareCandidates("ovmf-code"))
	case spec.FirmwareQboot:
		return firstExisting(firmwareCandidates("qboot"))
	}
	return ""
}

// OVMFVars is the template each UEFI VM's variable store is copied from, ""
// when OVMF is not installed.
func OVMFVars() string { return firstExisting(firmwareCandidates("ovmf-vars")) }

// BootCode is the code image QEMU runs for b: the Secure Boot (SMM) build
// of OVMF with secure_boot, else FirmwareCode's.
func BootCode(b spec.Boot) string {
	if b.SecureBoot {
		return firstExisting(firmwareCandidates("ovmf-code-secboot"))
	}
	return FirmwareCode(b.Firmware)
}

// VarsTemplate is what a UEFI VM's variable store is copied from at its
// first start: the file's vars_template, else with secure_boot the store
// with Microsoft's keys, else the empty one; "" when it is not installed.
func VarsTemplate(b spec.Boot) string {
	switch {
	case b.VarsTemplate != "":
		return b.VarsTemplate
	case b.SecureBoot:
		return firstExisting(firmwareCandidates("ovmf-vars-ms"))
	}
	return OVMFVars()
}

// QbootROM is where the qboot ROM is looked for first.
func QbootROM() string { return firmwareCandidates("qboot")[0] }
