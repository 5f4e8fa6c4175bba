package spec

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// The VM's identity as the guest sees it (its UUID, SMBIOS, systemd
// credentials, generation id) and the platform devices libvirt adds to every
// domain, each with a key to turn it off: all top-level keys but [smbios] and
// [credentials].

// SMBIOS is what the guest reads from its firmware tables: type 1 (system)
// strings and type 11 OEM strings. The type 1 UUID is the VM's uuid.
type SMBIOS struct {
	Manufacturer string   `toml:"manufacturer"`
	Product      string   `toml:"product"`
	Version      string   `toml:"version"`
	Serial       string   `toml:"serial"`
	SKU          string   `toml:"sku"`
	Family       string   `toml:"family"`
	OEMStrings   []string `toml:"oem_strings"` // type 11, in order, after the credentials
}

// Fields returns the type 1 strings in QEMU's -smbios key order, as key
// and value pairs, the empty ones left out.
func (s SMBIOS) Fields() [][2]string {
	var out [][2]string
	for _, kv := range [][2]string{{"manufacturer", s.Manufacturer}, {"product", s.Product}, {"version", s.Version},
		{"serial", s.Serial}, {"sku", s.SKU}, {"family", s.Family}} {
		if kv[1] != "" {
			out = append(out, kv)
		}
	}
	return out
}

// Identity and platform limits. SMBIOS strings longer than 64 bytes are
// legal but dmidecode and firmware setup screens cut them; a credential
// travels in one SMBIOS structure, whose formatted part QEMU bounds.
const (
	MaxSMBIOSString    = 64
	MaxOEMString       = 1024
	MaxCredentialValue = 4096
	MaxCredentials     = 64
)

// CredentialPrefix is what systemd looks for in SMBIOS type 11 strings
// (systemd.system-credentials(7)): "io.systemd.credential:NAME=VALUE".
const CredentialPrefix = "io.systemd.credential:"

var (
	uuidRE       = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	credentialRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

// ValidUUID checks the 8-4-4-4-12 hex form QEMU's -uuid takes.
func ValidUUID(s string) error {
	if !uuidRE.MatchString(s) {
		return fmt.Errorf("%q is not a UUID (8-4-4-4-12 hex digits)", s)
	}
	return nil
}

// CredentialNames returns the credentials' names, sorted: the order they
// reach the guest in.
func (vm *VM) CredentialNames() []string {
	out := make([]string, 0, len(vm.Credentials))
	for k := range vm.Credentials {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// HasRNG reports whether the VM gets a virtio-rng device fed from the
// host's /dev/urandom (key rng; default true).
func (vm *VM) HasRNG() bool { return vm.RNG == nil || *vm.RNG }

// HasVMCoreInfo reports whether the VM gets a vmcoreinfo device, through
// which a guest kernel tells QEMU where its crash-dump notes are, so that
// a host-side dump can be read by crash(8) (key vmcoreinfo; default true).
func (vm *VM) HasVMCoreInfo() bool { return vm.VMCoreInfo == nil || *vm.VMCoreInfo }

// IsStrict reports whether the firmware boots only from the devices with
// a boot order, rather than falling back to any other (-boot strict=on;
// key boot.strict, default true, as libvirt). It applies when a disk has a
// boot_index: without one the firmware keeps its own order.
func (b Boot) IsStrict() bool { return b.Strict == nil || *b.Strict }

func (f *File) validateIdentity() error {
	vm := &f.VM
	if vm.UUID != "" {
		if err := ValidUUID(vm.UUID); err != nil {
			return f.Errorf("uuid", "%v", err)
		}
	}
	for _, kv := range vm.SMBIOS.Fields() {
		if err := smbiosText(kv[1], MaxSMBIOSString); err != nil {
			return f.Errorf("smbios."+kv[0], "%v", err)
		}
	}
	for i, s := range vm.SMBIOS.OEMStrings {
		if s == "" {
			return f.Errorf(fmt.Sprintf("smbios.oem_strings[%d]", i), "empty string (SMBIOS cannot carry one)")
		}
		if err := smbiosText(s, MaxOEMString); err != nil {
			return f.Errorf(fmt.Sprintf("smbios.oem_strings[%d]", i), "%v", err)
		}
	}
	if len(vm.Credentials) > MaxCredentials {
		return f.Errorf("credentials", "%d credentials, at most %d", len(vm.Credentials), MaxCredentials)
	}
	for _, name := range vm.CredentialNames() {
		if len(name) > 255 || !credentialRE.MatchString(name) {
			return f.Errorf("credentials."+name, "invalid credential name (letters, digits, '_', '.', '-'; at most 255 bytes)")
		}
		// The value goes in a file (never the argv): a NUL would end its
		// SMBIOS string early.
		if v := vm.Credentials[name]; strings.ContainsRune(v, 0) || len(v) > MaxCredentialValue {
			return f.Errorf("credentials."+name, "value has a NUL byte or is longer than %d bytes", MaxCredentialValue)
		}
	}
	return nil
}

// smbiosText: SMBIOS strings end at a NUL; control characters garble the
// tables' readers.
func smbiosText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("longer than %d bytes", max)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%q has a control character", s)
		}
	}
	return nil
}
