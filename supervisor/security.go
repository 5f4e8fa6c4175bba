package supervisor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/renameio/v2"

	"github.com/vmsup/vmsup/internal/posixacl"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Confinement, vmsup's version of libvirt's sVirt:
//   - QEMU runs as an unprivileged user (Options.QEMUUser, default
//     vmsup-qemu, created if missing) in a systemd sandbox (units.Sandbox).
//   - That user gets exactly the files the VM needs: it owns the VM's state
//     directory; every other file (disk images and their backing chains,
//     kernel, initrd, /dev/kvm) and the directories above them get one
//     POSIX ACL entry for it, only where it lacks access, recorded and taken
//     back on down. Owners and modes of the user's files never change. (fd
//     passing, as Incus does, would need QEMU started by vmsup itself or
//     systemd 253's OpenFile=; this host has systemd 252.)
//   - A per-VM AppArmor profile lists the same files where the kernel has
//     AppArmor.
// What vmsup did is recorded in Root/security/NAME.json, outside the state
// directory QEMU can write, so a compromised QEMU cannot widen its own grants.

// DefaultQEMUUser is the system user QEMU runs as.
const DefaultQEMUUser = "vmsup-qemu"

// PerVMUser as Options.QEMUUser gives each VM its own system user,
// "vmsupq-" and 10 hex digits of the SHA-256 of its name (useradd allows 32
// bytes, VM names have 64), so VMs cannot reach each other's files even
// without AppArmor. systemd 252 refuses a numeric User= without a passwd
// entry (status 217/USER, measured), hence real users; they are kept when a
// VM goes, so a later user never inherits files by a reused uid.
const PerVMUser = "per-vm"

// qemuUserName is the user QEMU of VM vm runs as.
func (s *Supervisor) qemuUserName(vm string) string {
	if s.opts.QEMUUser != PerVMUser {
		return s.opts.QEMUUser
	}
	h := sha256.Sum256([]byte(vm))
	return "vmsupq-" + hex.EncodeToString(h[:5])
}

// confinement is the record of one VM's confinement.
type confinement struct {
	User     string          `json:"user"`
	UID      uint32          `json:"uid"`
	GID      uint32          `json:"gid"`
	Seccomp  bool            `json:"seccomp"`
	AppArmor appArmorRecord  `json:"apparmor"`
	Uses     []string        `json:"uses"`   // every path QEMU's user needs, for shared grants
	Grants   []aclGrant      `json:"grants"` // ACL entries vmsup added
	Chowned  []chownRecord   `json:"chowned,omitempty"`
	Profile  *units.Profile  `json:"profile,omitempty"`
	Exposure *units.Exposure `json:"-"`
}

type appArmorRecord struct {
	Mode    string `json:"mode"`              // the spec's setting
	Profile string `json:"profile,omitempty"` // loaded profile name
	File    string `json:"file,omitempty"`
	Reason  string `json:"reason,omitempty"` // why the VM runs unconfined
}

type aclGrant struct {
	Path string `json:"path"`
	Perm uint16 `json:"perm"`
	Prev int    `json:"prev"` // the user's entry before (-1 none)
}

type chownRecord struct {
	Path     string `json:"path"`
	UID, GID int
}

// need is one path QEMU (or its stop hook) uses, with AppArmor letters.
type need struct {
	path, mode, field string
	disk              bool // subject to the image-directory rule
	noProfile         bool // not QEMU's: left out of the AppArmor profile
}

func (s *Supervisor) securityDir() string { return filepath.Join(s.opts.Root, "security") }
func (s *Supervisor) securityRecord(name string) string {
	return filepath.Join(s.securityDir(), name+".json")
}

// securitySteps prepares the VM's confinement: QEMU user, file access,
// AppArmor, and the unit's sandbox.
func (s *Supervisor) securitySteps(f *spec.File, p vmPaths, plan *startPlan) []step {
	var c *confinement
	return []step{{name: "confine", do: func(ctx context.Context) (err error) {
		// The default image directory is where disks hot-plugged later must
		// lie (the unit binds it at start): make sure it exists.
		if def := filepath.Join(s.opts.Root, "images"); slices.Contains(s.opts.ImageDirs, def) {
			if err := os.MkdirAll(def, 0o755); err != nil {
				return err
			}
		}
		// Confine what QEMU will really open: the file's disks plus those
		// carried over from earlier attaches (storage.go).
		boot := bootFile(f, plan.carried)
		c, err = s.confine(ctx, boot, p)
		if err != nil {
			return err
		}
		plan.unitOpts = append(plan.unitOpts, func(u *units.Unit) { s.sandboxUnit(u, boot, p, c) })
		return nil
	}, undo: func(ctx context.Context) { _ = s.securityTeardown(ctx, f.VM.Name) }}}
}

// checkSecurity is what Validate checks of the confinement: the
// "required" refusals, without touching anything.
func (s *Supervisor) checkSecurity(ctx context.Context, f *spec.File) error {
	if f.VM.Security.AppArmor != spec.AppArmorRequired {
		return nil
	}
	needs, err := s.vmNeeds(ctx, f, s.paths(f.VM.Name))
	if err != nil {
		return err
	}
	if err := s.checkImageDirs(f, needs); err != nil {
		return err
	}
	if why := s.hostFacts().AppArmorUnusable; why != "" {
		return f.Errorf("security.apparmor", "\"required\" but %s: refusing to start VM %q unconfined", why, f.VM.Name)
	}
	return nil
}

func (s *Supervisor) confine(ctx context.Context, f *spec.File, p vmPaths) (*confinement, error) {
	vm := &f.VM
	// A previous run that crashed may have left its grants: release them.
	if err := s.securityTeardown(ctx, vm.Name); err != nil {
		return nil, err
	}
	needs, err := s.vmNeeds(ctx, f, p)
	if err != nil {
		return nil, err
	}
	mode := vm.Security.AppArmor
	aaWhy := s.hostFacts().AppArmorUnusable
	if err := s.checkSecurity(ctx, f); err != nil {
		return nil, err
	}
	qu, uid, gid, err := s.qemuIdentity(ctx, vm.Name)
	if err != nil {
		return nil, err
	}
	c := &confinement{User: qu, UID: uid, GID: gid, Seccomp: vm.Security.HasSeccomp(),
		AppArmor: appArmorRecord{Mode: mode}}
	ok := false
	defer func() {
		if !ok {
			s.release(c)
		}
	}()
	if err := s.giveStateDir(c, p); err != nil {
		return nil, err
	}
	unlock, err := s.lockSecurity(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range needs {
		if err := s.grantNeed(c, n); err != nil {
			unlock()
			return nil, fmt.Errorf("%s: %w", n.field, err)
		}
	}
	unlock()
	switch {
	case mode == spec.AppArmorOff:
		c.AppArmor.Reason = "security.apparmor is \"off\""
	case aaWhy != "":
		c.AppArmor.Reason = aaWhy
	default:
		if err := s.loadProfile(ctx, c, vm, p, needs); err != nil {
			return nil, err
		}
	}
	if err := s.writeConfinement(vm.Name, c); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// vmNeeds lists every host path the VM's QEMU and stop hook use.
func (s *Supervisor) vmNeeds(ctx context.Context, f *spec.File, p vmPaths) ([]need, error) {
	vm := &f.VM
	var ns []need
	for i, d := range vm.Disks {
		field := fmt.Sprintf("%s: disk[%d] %q", f.Path, i, d.Name)
		rules, err := diskRules(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		for _, r := range rules {
			ns = append(ns, need{path: r.Path, mode: r.Mode, field: field, disk: true})
		}
	}
	for _, b := range []struct{ field, path string }{{"boot.kernel", vm.Boot.Kernel}, {"boot.initrd", vm.Boot.Initrd}} {
		if b.path != "" {
			ns = append(ns, need{path: b.path, mode: "r", field: f.Path + ": " + b.field})
		}
	}
	if fw := firmwareCode(vm.Boot.Firmware); fw != "" {
		ns = append(ns, need{path: fw, mode: "r", field: f.Path + ": boot.firmware"})
	}
	// The unit's ExecStop= runs vmsup itself as the QEMU user; both need
	// the state directory (the profile lists it on its own).
	ns = append(ns, need{path: s.opts.Self, mode: "rx", field: "vmsup binary (stop hook)", noProfile: true},
		need{path: p.Dir, mode: "rwx", field: "state directory", noProfile: true})
	accel, _, _, _ := s.resolveHost(f)
	if accel == spec.AccelKVM {
		ns = append(ns, need{path: "/dev/kvm", mode: "rw", field: f.Path + ": accel kvm"})
	}
	for i, n := range vm.NICs {
		if n.Type != spec.NICUser { // taps opened by QEMU itself
			ns = append(ns, need{path: "/dev/net/tun", mode: "rw", field: fmt.Sprintf("%s: nic[%d]", f.Path, i)})
			break
		}
	}
	return ns, nil
}

// diskRules lists the host files QEMU opens for disk d, with their modes:
// an image file and its whole backing chain (bases only read), a block
// device or an ISO. Network disks open no host file, and a seed's ISO and
// disk secrets live in the state directory, which QEMU's user owns.
func diskRules(ctx context.Context, d spec.Disk) ([]units.PathRule, error) {
	switch d.Type {
	case spec.DiskISCSI, spec.DiskRBD, spec.DiskSeed:
		return nil, nil
	case spec.DiskBlock, spec.DiskISO:
		m := "rwk"
		if d.ReadOnly || d.Type == spec.DiskISO {
			m = "rk"
		}
		return []units.PathRule{{Path: d.File, Mode: m}}, nil
	}
	chain := []string{d.File}
	if d.Format == spec.FormatQcow2 {
		var err error
		if chain, err = backingChain(ctx, d.File); err != nil {
			return nil, err
		}
	}
	var out []units.PathRule
	for j, file := range chain {
		m := "rwk"
		if d.ReadOnly || j > 0 { // bases of a chain are only read
			m = "rk"
		}
		out = append(out, units.PathRule{Path: file, Mode: m})
	}
	return out, nil
}

func firmwareCode(fw string) string {
	switch fw {
	case spec.FirmwareUEFI:
		return firstExisting(ovmfCode)
	case spec.FirmwareQboot:
		return firstExisting(qbootROM)
	}
	return ""
}

// backingChain returns the image and every file below it, top first, as
// qemu-img reads them (so a relative backing name resolves as QEMU will).
func backingChain(ctx context.Context, file string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--backing-chain", "--output=json", "-U", file).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("read backing chain of %s: %w", file, err)
	}
	var infos []struct {
		Filename string `json:"filename"`
	}
	if err := json.Unmarshal(out, &infos); err != nil {
		return nil, fmt.Errorf("read backing chain of %s: %w", file, err)
	}
	chain := make([]string, 0, len(infos))
	for _, in := range infos {
		a, err := filepath.Abs(in.Filename)
		if err != nil || strings.Contains(in.Filename, ":") && !strings.HasPrefix(in.Filename, "/") {
			return nil, fmt.Errorf("backing file %q of %s is not a local file", in.Filename, file)
		}
		chain = append(chain, a)
	}
	return chain, nil
}

// checkImageDirs enforces the image-directory rule of "required" mode: every
// disk image and backing file lies, after resolving symlinks, under one of
// Options.ImageDirs.
func (s *Supervisor) checkImageDirs(f *spec.File, ns []need) error {
	for _, n := range ns {
		if !n.disk {
			continue
		}
		inside, err := s.inImageDirs(n.path)
		if err != nil {
			return fmt.Errorf("%s: %w", n.field, err)
		}
		if !inside {
			return fmt.Errorf("%s: %s is outside the image directories (%s): security.apparmor = \"required\" confines QEMU to them",
				n.field, n.path, strings.Join(s.opts.ImageDirs, ", "))
		}
	}
	return nil
}

// inImageDirs reports whether path (symlinks resolved) lies in one of the
// image directories.
func (s *Supervisor) inImageDirs(path string) (bool, error) {
	// The file itself may not exist yet (created on attach): resolve its
	// directory.
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return false, err
	}
	real := filepath.Join(dir, filepath.Base(path))
	if r, err := filepath.EvalSymlinks(path); err == nil {
		real = r
	}
	for _, d := range s.opts.ImageDirs {
		dr, err := filepath.EvalSymlinks(d)
		if err != nil {
			continue
		}
		if rel, err := filepath.Rel(dr, real); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
			return true, nil
		}
	}
	return false, nil
}

// qemuIdentity is the user QEMU of VM vm runs as, created if missing: what
// another host step needs before confine runs (a tap's owner, TUNSETOWNER).
func (s *Supervisor) qemuIdentity(ctx context.Context, vm string) (name string, uid, gid uint32, err error) {
	name = s.qemuUserName(vm)
	uid, gid, err = s.qemuUser(ctx, name)
	return name, uid, gid, err
}

// qemuUser looks the QEMU user up and creates it as a system user if
// missing (as scripts/install-deps.sh does).
func (s *Supervisor) qemuUser(ctx context.Context, name string) (uint32, uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		out, cerr := exec.CommandContext(ctx, "useradd", "--system", "--user-group", "--no-create-home",
			"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
		if cerr != nil {
			return 0, 0, fmt.Errorf("QEMU user %q does not exist and useradd failed: %v: %s (create it, or run scripts/install-deps.sh)",
				name, cerr, strings.TrimSpace(string(out)))
		}
		if u, err = user.Lookup(name); err != nil {
			return 0, 0, fmt.Errorf("QEMU user %q: %w", name, err)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	if uid == 0 {
		return 0, 0, fmt.Errorf("QEMU user %q is uid 0: vmsup never runs QEMU as root", name)
	}
	return uint32(uid), uint32(gid), nil
}

// giveStateDir makes the QEMU user the owner of the VM's state directory
// and what is in it (sockets, console log, UEFI variables, spec copy), so
// QEMU and its stop hook work there without further grants.
func (s *Supervisor) giveStateDir(c *confinement, p vmPaths) error {
	// The QMP lock is taken by vmsup commands and by the stop hook.
	if lf, err := os.OpenFile(p.QMPLock, os.O_CREATE|os.O_RDONLY, 0o600); err == nil {
		lf.Close()
	}
	ents, err := os.ReadDir(p.Dir)
	if err != nil {
		return err
	}
	paths := []string{p.Dir}
	for _, e := range ents {
		paths = append(paths, filepath.Join(p.Dir, e.Name()))
	}
	// Disk secrets (storage.go) sit one level down, in secrets/.
	if subs, err := os.ReadDir(filepath.Join(p.Dir, "secrets")); err == nil {
		for _, e := range subs {
			paths = append(paths, filepath.Join(p.Dir, "secrets", e.Name()))
		}
	}
	for _, path := range paths {
		fi, err := os.Lstat(path)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid == c.UID {
			continue
		}
		if err := os.Lchown(path, int(c.UID), int(c.GID)); err != nil {
			return fmt.Errorf("give %s to %s: %w", path, c.User, err)
		}
		c.Chowned = append(c.Chowned, chownRecord{Path: path, UID: int(st.Uid), GID: int(st.Gid)})
	}
	return nil
}

// grantNeed gives the QEMU user search on every directory above n.path and
// the permissions n.mode asks for on it, adding ACL entries only where the
// user lacks them.
func (s *Supervisor) grantNeed(c *confinement, n need) error {
	want := uint16(0)
	for _, l := range n.mode {
		switch l {
		case 'r':
			want |= 4
		case 'w':
			want |= 2
		case 'x':
			want |= 1
		}
	}
	path := filepath.Clean(n.path)
	var chain []string
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		chain = append([]string{d}, chain...)
		if d == "/" {
			break
		}
	}
	for _, d := range chain {
		if err := s.grantPath(c, d, 1); err != nil {
			return err
		}
	}
	return s.grantPath(c, path, want)
}

func (s *Supervisor) grantPath(c *confinement, path string, want uint16) error {
	c.Uses = appendUnique(c.Uses, path)
	ok, err := posixacl.HasAccess(path, c.UID, c.GID, nil, want)
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	prev, err := posixacl.GrantUser(path, c.UID, want)
	if err != nil {
		return fmt.Errorf("give %s access to %s: %w", c.User, path, err)
	}
	c.Grants = append(c.Grants, aclGrant{Path: path, Perm: want, Prev: prev})
	return nil
}

func appendUnique(l []string, s string) []string {
	for _, x := range l {
		if x == s {
			return l
		}
	}
	return append(l, s)
}

func (s *Supervisor) loadProfile(ctx context.Context, c *confinement, vm *spec.VM, p vmPaths, ns []need) error {
	prof, err := s.buildProfile(vm, p, ns)
	if err != nil {
		return err
	}
	c.Profile = prof
	return s.reloadProfile(ctx, vm.Name, c)
}

func (s *Supervisor) buildProfile(vm *spec.VM, p vmPaths, ns []need) (*units.Profile, error) {
	prof := &units.Profile{Name: units.ProfileName(vm.Name), Binary: s.opts.QEMU, Network: len(vm.NICs) > 0}
	if err := prof.AddPath(units.PathRule{Path: p.Dir + "/", Mode: "rwk"}); err != nil {
		return nil, err
	}
	for _, n := range ns {
		if n.noProfile {
			continue
		}
		if err := prof.AddPath(units.PathRule{Path: n.path, Mode: n.mode}); err != nil {
			return nil, fmt.Errorf("%s: %w", n.field, err)
		}
	}
	return prof, nil
}

// AppArmorProfile returns the AppArmor profile vmsup loads for f where the
// kernel has AppArmor (disks with their backing chains, boot files, the
// state directory), whatever this host has.
func (s *Supervisor) AppArmorProfile(ctx context.Context, f *spec.File) (*units.Profile, error) {
	p := s.paths(f.VM.Name)
	ns, err := s.vmNeeds(ctx, f, p)
	if err != nil {
		return nil, err
	}
	return s.buildProfile(&f.VM, p, ns)
}

// reloadProfile writes the VM's profile and loads (or replaces) it.
func (s *Supervisor) reloadProfile(ctx context.Context, name string, c *confinement) error {
	text, err := c.Profile.Render()
	if err != nil {
		return err
	}
	file := filepath.Join(s.securityDir(), name+".apparmor")
	if err := os.MkdirAll(s.securityDir(), 0o700); err != nil {
		return err
	}
	if err := renameio.WriteFile(file, text, 0o600); err != nil {
		return err
	}
	if err := (units.Parser{}).Load(ctx, file); err != nil {
		return fmt.Errorf("load AppArmor profile %s: %w", c.Profile.Name, err)
	}
	c.AppArmor.Profile, c.AppArmor.File = c.Profile.Name, file
	return nil
}

// hasNetworkDisk: iSCSI and RBD disks need the host network (their targets
// are reached over TCP) even for a VM without NICs.
func hasNetworkDisk(vm *spec.VM) bool {
	for _, d := range vm.Disks {
		if d.Type == spec.DiskISCSI || d.Type == spec.DiskRBD {
			return true
		}
	}
	return false
}

// sandboxUnit confines the VM's unit: QEMU's user, the sandbox, its files.
func (s *Supervisor) sandboxUnit(u *units.Unit, f *spec.File, p vmPaths, c *confinement) {
	sb := &units.Sandbox{
		User: c.User, Group: c.User,
		ReadWritePaths: []string{p.Dir},
		BindPaths:      []string{p.Dir},
		// Other VMs' state directories (their QMP sockets!) belong to the
		// same user: hide them all and bind this VM's own back in.
		HidePaths:       []string{filepath.Dir(p.Dir)},
		HostNetwork:     len(f.VM.NICs) > 0 || hasNetworkDisk(&f.VM),
		AppArmorProfile: c.AppArmor.Profile,
	}
	seen := map[string]bool{p.Dir: true}
	for _, use := range c.Uses {
		if fi, err := os.Stat(use); err != nil || fi.IsDir() || seen[use] {
			continue
		}
		seen[use] = true
		if strings.HasPrefix(use, "/dev/") {
			sb.Devices = append(sb.Devices, units.DeviceRule{Path: use, Access: "rw"})
			continue
		}
		sb.BindPaths = append(sb.BindPaths, use)
	}
	for _, d := range f.VM.Disks {
		if !d.ReadOnly && d.File != "" && (d.Type == spec.DiskFile || d.Type == "") {
			sb.ReadWritePaths = append(sb.ReadWritePaths, d.File)
		}
	}
	// Disks hot-plugged later come from the image directories: the unit's
	// mount namespace is fixed at start, so they are visible and writable
	// there (each file still needs its ACL entry and profile rule).
	for _, d := range s.opts.ImageDirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			sb.ReadWritePaths = append(sb.ReadWritePaths, d)
			sb.BindPaths = append(sb.BindPaths, d)
		}
	}
	u.Sandbox = sb
}
