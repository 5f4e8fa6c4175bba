package units

import (
	"fmt"
	"path/filepath"
	"strings"

	sd "github.com/coreos/go-systemd/v22/dbus"
)

// Sandbox is the systemd confinement of a unit: an unprivileged user, no
// capabilities, a read-only view of the host with the unit's own files
// writable, and the kernel-facing knobs closed. Every setting below was
// measured with QEMU 7.2 booting a TCG guest under systemd 252 (see
// units_test TestSandboxExposure); what QEMU needs open is a field.
type Sandbox struct {
	User, Group         string   // the service's identity; required
	SupplementaryGroups []string // e.g. "kvm" where /dev/kvm is group-accessible

	// ReadWritePaths are the only host paths the service may write (its
	// state directory, writable disk images); the rest of the host is
	// read-only (ProtectSystem=strict).
	ReadWritePaths []string
	// BindPaths are bind-mounted at the same path into the unit's mount
	// namespace so files under /tmp, /home or /root stay reachable through
	// PrivateTmp= and ProtectHome=. Every path the service opens belongs here.
	BindPaths []string
	// HidePaths get an empty read-only tmpfs over them (TemporaryFileSystem=)
	// before BindPaths are mounted, so of a directory shared by many VMs
	// (vmsup's vms/) the unit sees only what is bound back in: its own.
	HidePaths []string
	// HostNetwork keeps the host's network namespace and Internet sockets
	// (user-mode NICs with host forwards, taps); false gives the unit
	// PrivateNetwork= and only AF_UNIX sockets.
	HostNetwork bool
	// Devices are the device nodes bind-mounted into the unit's private /dev
	// and allowed in its device cgroup (/dev/kvm, /dev/net/tun).
	Devices []DeviceRule
	// AllowWriteExecute drops MemoryDenyWriteExecute=. QEMU's TCG needs it
	// unless it runs with split-wx=on (code buffer mapped twice, never W+X).
	AllowWriteExecute bool
	// AppArmorProfile, when set, is the loaded profile the service runs under.
	AppArmorProfile string
}

// deniedSyscalls are removed from @system-service: QEMU with TCG or KVM uses
// none of them (measured), and systemd-analyze counts each group.
const deniedSyscalls = "~@privileged @resources @clock @cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap"

func checkSandboxPath(p string) error {
	if !filepath.IsAbs(p) || strings.ContainsAny(p, "\n\x00") {
		return fmt.Errorf("sandbox path %q must be absolute and one line", p)
	}
	return nil
}

func (s *Sandbox) properties(u *Unit) ([]sd.Property, error) {
	if s.User == "" || s.User == "root" || s.User == "0" {
		return nil, fmt.Errorf("unit %s: sandbox needs an unprivileged User=, not %q", u.Name, s.User)
	}
	for _, l := range [][]string{s.ReadWritePaths, s.BindPaths, s.HidePaths} {
		for _, p := range l {
			if err := checkSandboxPath(p); err != nil {
				return nil, fmt.Errorf("unit %s: %w", u.Name, err)
			}
		}
	}
	group := s.Group
	if group == "" {
		group = s.User
	}
	families := []string{"AF_UNIX"}
	if s.HostNetwork {
		families = append(families, "AF_INET", "AF_INET6")
	}
	p := []sd.Property{
		prop("User", s.User),
		prop("Group", group),
		prop("NoNewPrivileges", true),
		prop("CapabilityBoundingSet", uint64(0)),
		prop("AmbientCapabilities", uint64(0)),
		prop("ProtectSystem", "strict"),
		prop("ProtectHome", "yes"),
		prop("PrivateTmp", true),
		prop("PrivateUsers", true),
		prop("PrivateDevices", true),
		prop("ProtectKernelTunables", true),
		prop("ProtectKernelModules", true),
		prop("ProtectKernelLogs", true),
		prop("ProtectControlGroups", true),
		prop("ProtectClock", true),
		prop("ProtectHostname", true),
		prop("ProtectProc", "invisible"),
		prop("ProcSubset", "pid"),
		prop("LockPersonality", true),
		prop("RestrictNamespaces", uint64(0)), // = RestrictNamespaces=yes: none allowed
		prop("RestrictRealtime", true),
		prop("RestrictSUIDSGID", true),
		prop("RemoveIPC", true),
		prop("KeyringMode", "private"),
		prop("SystemCallArchitectures", []string{"native"}),
		// QEMU's own -sandbox needs seccomp(2) itself, which no group holds.
		prop("SystemCallFilter", syscallFilter(true, "@system-service", "seccomp")),
		prop("SystemCallErrorNumber", int32(1)), // EPERM, not a kill: QEMU reports it
		prop("RestrictAddressFamilies", syscallFilter(true, families...)),
		prop("MemoryDenyWriteExecute", !s.AllowWriteExecute),
	}
	// A second SystemCallFilter= assignment removes groups from the list.
	p = append(p, prop("SystemCallFilter", syscallFilter(false, strings.Fields(strings.TrimPrefix(deniedSyscalls, "~"))...)))
	if len(s.SupplementaryGroups) > 0 {
		p = append(p, prop("SupplementaryGroups", s.SupplementaryGroups))
	}
	if !s.HostNetwork {
		p = append(p, prop("PrivateNetwork", true), prop("IPAddressDeny", []ipAddress{{2, []byte{0, 0, 0, 0}, 0}, {10, make([]byte, 16), 0}}))
	}
	if len(s.ReadWritePaths) > 0 {
		p = append(p, prop("ReadWritePaths", s.ReadWritePaths))
	}
	// A private /dev/shm: PrivateDevices= binds the host's into the new
	// /dev, where QEMU could leave files for other services.
	v := []tmpfsPath{{Path: "/dev/shm", Options: "mode=1777,size=16m,nosuid,nodev,noexec"}}
	for _, h := range s.HidePaths {
		v = append(v, tmpfsPath{Path: h, Options: "ro,mode=0755"})
	}
	p = append(p, prop("TemporaryFileSystem", v))
	binds := append([]string(nil), s.BindPaths...)
	for _, d := range s.Devices {
		binds = append(binds, d.Path)
	}
	if len(binds) > 0 {
		v := make([]bindPath, 0, len(binds))
		for _, b := range binds {
			v = append(v, bindPath{Source: b, Dest: b, IgnoreMissing: false, Flags: 0})
		}
		p = append(p, prop("BindPaths", v))
	}
	if s.AppArmorProfile != "" {
		p = append(p, prop("AppArmorProfile", apparmorProp{Ignore: false, Name: s.AppArmorProfile}))
	}
	return p, nil
}

// syscallFilter is systemd's (bas) allow/deny list property.
type syscallFilterValue struct {
	Allow bool
	Names []string
}

func syscallFilter(allow bool, names ...string) syscallFilterValue {
	return syscallFilterValue{Allow: allow, Names: names}
}

// bindPath is one BindPaths= entry (ssbt): source, destination, ignore a
// missing source, mount flags (0 = recursive bind).
type bindPath struct {
	Source, Dest  string
	IgnoreMissing bool
	Flags         uint64
}

// tmpfsPath is one TemporaryFileSystem= entry (ss): path, mount options.
type tmpfsPath struct{ Path, Options string }

// ipAddress is one IPAddressDeny= entry (iayu): family, address, prefix.
type ipAddress struct {
	Family int32
	Addr   []byte
	Prefix uint32
}

// apparmorProp is AppArmorProfile= (bs): ignore if missing, profile name.
type apparmorProp struct {
	Ignore bool
	Name   string
}
