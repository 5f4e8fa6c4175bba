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
// units_test TestSandboxExposure); what QEMU needs open is a field. The
// same sandbox renders as a transient unit's D-Bus properties and as a unit
// file's lines (SocketService), from one list.
type Sandbox struct {
	User, Group         string   // the service's identity; required unless Capabilities
	SupplementaryGroups []string // e.g. "kvm" where /dev/kvm is group-accessible
	// DynamicUser has systemd allocate User (a name) while the unit runs:
	// a service that owns no files.
	DynamicUser bool
	// Capabilities, when set, runs the service as root with only these
	// capabilities (e.g. "CAP_DAC_OVERRIDE") and no user namespace, so
	// they reach other users' files: a reader of every VM's sockets. User
	// must be empty. Without it a sandbox never runs as root.
	Capabilities []string

	// ReadWritePaths are the only host paths the service may write (its
	// state directory, writable disk images); the rest of the host is
	// read-only (ProtectSystem=strict). A "-" before a path (systemd's own
	// spelling) makes it optional: see BindPaths.
	ReadWritePaths []string
	// BindPaths are bind-mounted at the same path into the unit's mount
	// namespace so files under /tmp, /home or /root stay reachable through
	// PrivateTmp= and ProtectHome=. Every path the service opens belongs here.
	// A "-" before a path makes it optional: a source that is gone is
	// skipped instead of failing every later spawn of the unit (its stop
	// hooks with status 226/NAMESPACE) - what an operation that deletes or
	// moves a file the unit named at start needs.
	BindPaths []string
	// ReadOnlyBindPaths are BindPaths mounted read-only (the vmsup binary
	// a companion runs).
	ReadOnlyBindPaths []string
	// HidePaths get an empty read-only tmpfs over them (TemporaryFileSystem=)
	// before BindPaths are mounted, so of a directory shared by many VMs
	// (vmsup's vms/) the unit sees only what is bound back in: its own.
	HidePaths []string
	// HostNetwork keeps the host's network namespace and Internet sockets
	// (user-mode NICs with host forwards, taps); false gives the unit
	// PrivateNetwork= and only AF_UNIX sockets.
	HostNetwork bool
	// Netlink keeps the host's network namespace with netlink sockets but
	// no Internet ones: a reader of link counters.
	Netlink bool
	// SeeProcesses shows the service other users' processes in /proc
	// (ProtectProc=default): a reader of QEMU's scheduler figures.
	SeeProcesses bool
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

// noNamespaces is RestrictNamespaces= as a set of CLONE_NEW* flags allowed:
// only CLONE_NEWTIME. 0 (none at all) is what "yes" means, but systemd 252
// writes 0 into the transient unit's file as an empty assignment, which a
// daemon-reload reads as "no restriction" (measured). A time namespace
// needs CAP_SYS_ADMIN, which no sandboxed service has and cannot get
// without a user namespace, which stays refused.
const noNamespaces = uint64(0x80) // CLONE_NEWTIME

func checkSandboxPath(p string) error {
	if !filepath.IsAbs(strings.TrimPrefix(p, "-")) || strings.ContainsAny(p, "\n\x00") {
		return fmt.Errorf("sandbox path %q must be absolute and one line", p)
	}
	return nil
}

// setting is one unit setting in both of systemd's forms, made together so
// they cannot drift: the D-Bus value of a transient unit's property and
// the value of a unit file's line.
type setting struct {
	name  string
	value any    // D-Bus
	text  string // unit file
}

func yesNo(name string, v bool) setting {
	t := "no"
	if v {
		t = "yes"
	}
	return setting{name, v, t}
}

func word(name, v string) setting { return setting{name, v, v} }

func (s *Sandbox) check(unit string) error {
	switch {
	case len(s.Capabilities) > 0 && s.User != "":
		return fmt.Errorf("unit %s: a sandbox with capabilities runs as root: User must be empty, not %q", unit, s.User)
	case len(s.Capabilities) == 0 && (s.User == "" || s.User == "root" || s.User == "0"):
		return fmt.Errorf("unit %s: sandbox needs an unprivileged User=, not %q", unit, s.User)
	}
	for _, l := range [][]string{s.ReadWritePaths, s.BindPaths, s.ReadOnlyBindPaths, s.HidePaths} {
		for _, p := range l {
			if err := checkSandboxPath(p); err != nil {
				return fmt.Errorf("unit %s: %w", unit, err)
			}
		}
	}
	for _, h := range s.HidePaths {
		if strings.HasPrefix(h, "-") { // a tmpfs over a path has no optional form
			return fmt.Errorf("unit %s: hide path %q cannot be optional", unit, h)
		}
	}
	return nil
}

// settings is the sandbox as settings, in the order systemd applies them.
func (s *Sandbox) settings(unit string) ([]setting, error) {
	if err := s.check(unit); err != nil {
		return nil, err
	}
	caps, err := capMask(s.Capabilities)
	if err != nil {
		return nil, fmt.Errorf("unit %s: %w", unit, err)
	}
	p := append(s.identity(caps), s.protections()...)
	p = append(p, s.syscalls()...)
	p = append(p, s.network()...)
	return append(p, s.mounts()...), nil
}

// identity: who the service is and what it may become.
func (s *Sandbox) identity(caps uint64) []setting {
	var p []setting
	if s.User != "" {
		group := s.Group
		if group == "" {
			group = s.User
		}
		p = append(p, word("User", s.User), word("Group", group))
	}
	if s.DynamicUser {
		p = append(p, yesNo("DynamicUser", true))
	}
	if len(s.SupplementaryGroups) > 0 {
		p = append(p, setting{"SupplementaryGroups", s.SupplementaryGroups, strings.Join(s.SupplementaryGroups, " ")})
	}
	p = append(p, yesNo("NoNewPrivileges", true),
		setting{"CapabilityBoundingSet", caps, strings.Join(s.Capabilities, " ")},
		setting{"AmbientCapabilities", uint64(0), ""},
		// Root needs its own user namespace's root to reach other
		// users' files: no user namespace then.
		yesNo("PrivateUsers", len(s.Capabilities) == 0))
	return p
}

// protections: the kernel-facing knobs, all closed.
func (s *Sandbox) protections() []setting {
	proc := "invisible"
	if s.SeeProcesses {
		proc = "default"
	}
	return []setting{
		word("ProtectSystem", "strict"),
		word("ProtectHome", "yes"),
		yesNo("PrivateTmp", true),
		yesNo("PrivateDevices", true),
		yesNo("ProtectKernelTunables", true),
		yesNo("ProtectKernelModules", true),
		yesNo("ProtectKernelLogs", true),
		yesNo("ProtectControlGroups", true),
		yesNo("ProtectClock", true),
		yesNo("ProtectHostname", true),
		word("ProtectProc", proc),
		word("ProcSubset", "pid"),
		yesNo("LockPersonality", true),
		setting{"RestrictNamespaces", noNamespaces, "time"},
		yesNo("RestrictRealtime", true),
		yesNo("RestrictSUIDSGID", true),
		yesNo("RemoveIPC", true),
		word("KeyringMode", "private"),
		yesNo("MemoryDenyWriteExecute", !s.AllowWriteExecute),
	}
}

// syscalls: the native ABI, @system-service less the groups nothing of
// vmsup uses.
func (s *Sandbox) syscalls() []setting {
	denied := strings.Fields(strings.TrimPrefix(deniedSyscalls, "~"))
	return []setting{
		setting{"SystemCallArchitectures", []string{"native"}, "native"},
		// QEMU's own -sandbox needs seccomp(2) itself, which no group holds.
		setting{"SystemCallFilter", syscallFilter(true, "@system-service", "seccomp"), "@system-service seccomp"},
		// A second SystemCallFilter= assignment removes groups from the list.
		setting{"SystemCallFilter", syscallFilter(false, denied...), deniedSyscalls},
		setting{"SystemCallErrorNumber", int32(1), "EPERM"}, // not a kill: QEMU reports it
	}
}

// network: the sockets the service may make and the namespace it is in.
func (s *Sandbox) network() []setting {
	families := []string{"AF_UNIX"}
	if s.HostNetwork {
		families = append(families, "AF_INET", "AF_INET6")
	}
	if s.Netlink {
		families = append(families, "AF_NETLINK")
	}
	p := []setting{{"RestrictAddressFamilies", syscallFilter(true, families...), strings.Join(families, " ")}}
	if !s.HostNetwork {
		p = append(p, setting{"IPAddressDeny", []ipAddress{{2, []byte{0, 0, 0, 0}, 0}, {10, make([]byte, 16), 0}}, "any"})
	}
	if !s.HostNetwork && !s.Netlink {
		p = append(p, yesNo("PrivateNetwork", true))
	}
	return p
}

// mounts: what the service sees of the host's files.
func (s *Sandbox) mounts() []setting {
	var p []setting
	if len(s.ReadWritePaths) > 0 {
		p = append(p, setting{"ReadWritePaths", s.ReadWritePaths, strings.Join(s.ReadWritePaths, " ")})
	}
	// A private /dev/shm: PrivateDevices= binds the host's into the new
	// /dev, where the service could leave files for other services.
	v := []tmpfsPath{{Path: "/dev/shm", Options: "mode=1777,size=16m,nosuid,nodev,noexec"}}
	for _, h := range s.HidePaths {
		v = append(v, tmpfsPath{Path: h, Options: "ro,mode=0755"})
	}
	var t []string
	for _, m := range v {
		t = append(t, m.Path+":"+m.Options)
	}
	p = append(p, setting{"TemporaryFileSystem", v, strings.Join(t, " ")})
	binds := append([]string(nil), s.BindPaths...)
	for _, d := range s.Devices {
		binds = append(binds, d.Path)
	}
	for _, b := range []struct {
		name  string
		paths []string
	}{{"BindPaths", binds}, {"BindReadOnlyPaths", s.ReadOnlyBindPaths}} {
		if len(b.paths) == 0 {
			continue
		}
		v := make([]bindPath, 0, len(b.paths))
		t := make([]string, 0, len(b.paths))
		for _, path := range b.paths {
			clean, optional := strings.CutPrefix(path, "-")
			v = append(v, bindPath{Source: clean, Dest: clean, IgnoreMissing: optional, Flags: 0})
			t = append(t, path)
		}
		p = append(p, setting{b.name, v, strings.Join(t, " ")})
	}
	if s.AppArmorProfile != "" {
		p = append(p, setting{"AppArmorProfile", apparmorProp{Ignore: false, Name: s.AppArmorProfile}, s.AppArmorProfile})
	}
	return p
}

func (s *Sandbox) properties(u *Unit) ([]sd.Property, error) {
	set, err := s.settings(u.Name)
	if err != nil {
		return nil, err
	}
	p := make([]sd.Property, 0, len(set))
	for _, x := range set {
		p = append(p, prop(x.name, x.value))
	}
	return p, nil
}

// directives renders the sandbox as a unit file's [Service] lines, its
// devices closed but for Devices.
func (s *Sandbox) directives(unit string) (string, error) {
	set, err := s.settings(unit)
	if err != nil {
		return "", err
	}
	for _, l := range [][]string{s.ReadWritePaths, s.BindPaths, s.ReadOnlyBindPaths, s.HidePaths} {
		for _, p := range l {
			if err := unitFilePath(p); err != nil {
				return "", fmt.Errorf("unit %s: %w", unit, err)
			}
		}
	}
	for _, d := range s.Devices {
		if err := unitFilePath(d.Path); err != nil {
			return "", fmt.Errorf("unit %s: %w", unit, err)
		}
	}
	var b strings.Builder
	for _, x := range set {
		fmt.Fprintf(&b, "%s=%s\n", x.name, x.text)
	}
	b.WriteString("DevicePolicy=closed\n")
	for _, d := range s.Devices {
		fmt.Fprintf(&b, "DeviceAllow=%s %s\n", d.Path, d.Access)
	}
	return b.String(), nil
}

// unitFilePath is a path a unit file's path lists take as it is: no
// quoting, escaping, ":" (BindPaths='s separator) or "%" (a specifier).
func unitFilePath(p string) error {
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._+-@,=", r)) {
			return fmt.Errorf("path %q cannot be written in a unit file as it is (%q)", p, r)
		}
	}
	return nil
}

// capMask is CapabilityBoundingSet='s bit mask of the named capabilities.
func capMask(names []string) (uint64, error) {
	var m uint64
	for _, n := range names {
		bit, ok := capBit(n)
		if !ok {
			return 0, fmt.Errorf("capability %q is not one a sandbox may keep", n)
		}
		m |= 1 << bit
	}
	return m, nil
}

// capBit is the number of a capability a sandbox may keep: those that
// read other users' files and enter other network namespaces, and those a
// network's DHCP and DNS server needs (ports 53 and 67, raw and ARP).
func capBit(name string) (uint, bool) {
	switch name {
	case "CAP_NET_BIND_SERVICE":
		return 10, true
	case "CAP_NET_ADMIN":
		return 12, true
	case "CAP_NET_RAW":
		return 13, true
	case "CAP_DAC_OVERRIDE":
		return 1, true
	case "CAP_DAC_READ_SEARCH":
		return 2, true
	case "CAP_SYS_ADMIN":
		return 21, true
	}
	return 0, false
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
