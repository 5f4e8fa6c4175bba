package qemuargs

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// The VM's identity on the command line: -uuid, SMBIOS type 1 and 11, the
// credential files, vmgenid; and the platform devices that have no PCI
// slot (vmcoreinfo) or a fixed one (virtio-rng, in slotDevices).

// identity renders -uuid and -smbios. Credentials reach QEMU as files
// (path=, one SMBIOS OEM string each, read when QEMU starts), so their
// values never show in the argv; OEM strings from the file follow them.
type identity struct {
	UUID        string
	System      [][2]string // type 1 key, value
	Credentials []string    // files, in credential name order
	OEMStrings  []string
}

func (id identity) Args() ([]string, error) {
	var a []string
	if id.UUID != "" {
		a = append(a, "-uuid", id.UUID)
	}
	if len(id.System) > 0 {
		v := "type=1"
		for _, kv := range id.System {
			e, err := escapeValue(kv[1])
			if err != nil {
				return nil, fmt.Errorf("smbios.%s: %w", kv[0], err)
			}
			v += "," + kv[0] + "=" + e
		}
		a = append(a, "-smbios", v)
	}
	for _, p := range id.Credentials {
		e, err := escapeValue(p)
		if err != nil {
			return nil, fmt.Errorf("credential file: %w", err)
		}
		a = append(a, "-smbios", "type=11,path="+e)
	}
	for i, s := range id.OEMStrings {
		e, err := escapeValue(s)
		if err != nil {
			return nil, fmt.Errorf("smbios.oem_strings[%d]: %w", i, err)
		}
		a = append(a, "-smbios", "type=11,value="+e)
	}
	return a, nil
}

// identityParts are the identity options of vm with o's UUID and
// generation id (the file's uuid wins), and its devices without a PCI slot
// (vmgenid, vmcoreinfo).
func identityParts(vm *spec.VM, o Options) (identity, []renderer, error) {
	id := identity{UUID: vmUUID(vm, o), System: vm.SMBIOS.Fields(), OEMStrings: vm.SMBIOS.OEMStrings}
	for _, name := range vm.CredentialNames() {
		p, ok := o.Credentials[name]
		if !ok || p == "" {
			return id, nil, errorf("credentials."+name, "no file for it in Options.Credentials")
		}
		id.Credentials = append(id.Credentials, p)
	}
	var devs []renderer
	if vm.VMGenID {
		if o.GenID == "" {
			return id, nil, errorf("vmgenid", "no generation id in Options.GenID")
		}
		if err := spec.ValidUUID(o.GenID); err != nil {
			return id, nil, errorf("Options.GenID", "%v", err)
		}
		devs = append(devs, Device{Driver: "vmgenid", ID: VMGenIDDeviceID, GUID: o.GenID})
	}
	if vm.HasVMCoreInfo() {
		devs = append(devs, Device{Driver: "vmcoreinfo", ID: VMCoreInfoDeviceID})
	}
	return id, devs, nil
}

// vmUUID is the UUID the VM runs with: the file's, else the caller's.
func vmUUID(vm *spec.VM, o Options) string { return strings.ToLower(cmp.Or(vm.UUID, o.UUID)) }

// bootStrict is -boot strict=on: the firmware tries only the devices with a
// boot index, as libvirt sets it.
type bootStrict struct{}

func (bootStrict) Args() ([]string, error) { return []string{"-boot", "strict=on"}, nil }
