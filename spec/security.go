package spec

// Security is the [security] table: how tightly QEMU is confined. QEMU always
// runs as an unprivileged user in a sandboxed systemd unit; these settings
// choose the layers that depend on the host or may be turned off.
type Security struct {
	// AppArmor: "auto" (default) confines QEMU with a per-VM profile where the
	// kernel has AppArmor and says in status why not elsewhere; "required"
	// refuses to start the VM unconfined or with a disk outside the
	// supervisor's image directories; "off" never loads a profile.
	AppArmor string `toml:"apparmor"`
	// Seccomp turns on QEMU's own system-call filter (-sandbox on with
	// obsolete, elevateprivileges, spawn and resourcecontrol denied).
	// Default true.
	Seccomp *bool `toml:"seccomp"`
}

// AppArmor modes.
const (
	AppArmorAuto     = "auto"
	AppArmorRequired = "required"
	AppArmorOff      = "off"
)

// HasSeccomp reports whether QEMU's seccomp sandbox is on.
func (s Security) HasSeccomp() bool { return s.Seccomp == nil || *s.Seccomp }

func (s *Security) applyDefaults() {
	if s.AppArmor == "" {
		s.AppArmor = AppArmorAuto
	}
	if s.Seccomp == nil {
		t := true
		s.Seccomp = &t
	}
}

func (f *File) validateSecurity() error {
	switch f.VM.Security.AppArmor {
	case AppArmorAuto, AppArmorRequired, AppArmorOff:
	default:
		return f.Errorf("security.apparmor", "unknown mode %q (want \"auto\", \"required\" or \"off\")", f.VM.Security.AppArmor)
	}
	return nil
}
