// Package confine is vmsup's version of libvirt's sVirt: what keeps each
// VM's QEMU to its own files.
//
//   - QEMU runs as an unprivileged user (Options.QEMUUser, default
//     vmsup-qemu, created if missing) in a systemd sandbox (units.Sandbox).
//   - That user gets exactly the files the VM needs: it owns the VM's state
//     directory (but the copies of the kernel and initrd vmsup makes there
//     from their checked descriptors, which stay root's: bootfiles.go);
//     every other file QEMU opens by name (disk images on a SATA bus,
//     firmware code, /dev/kvm) and the directories above them get one
//     POSIX ACL entry for it, only where it lacks access, recorded and
//     taken back on down. Owners and modes of the user's files never
//     change. (fd passing, as Incus does, would need QEMU started by vmsup
//     itself or systemd 253's OpenFile=; this host has systemd 252.)
//   - A per-VM AppArmor profile lists the same files where the kernel has
//     AppArmor.
//
// What vmsup did is recorded in Root/security/NAME.json, outside the state
// directory QEMU can write, so a compromised QEMU cannot widen its own grants.
package confine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/host/vfio"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/units"
)

// Manager confines the QEMUs of the VMs under one state root.
type Manager struct {
	Root      string   // the state root: records in Root/security
	QEMUUser  string   // the user QEMU runs as, or PerVMUser
	QEMU      string   // the QEMU binary (the AppArmor profile's)
	Self      string   // the vmsup binary the unit's stop hook runs
	ImageDirs []string // where "required" mode lets images lie
	// AppArmorUnusable is "" where the kernel enforces AppArmor, else why
	// not (the host probe's).
	AppArmorUnusable string
	// Hugetlbfs finds the VM's directory on the hugetlbfs mount of its page
	// size (a VM with hugepages maps its memory there; its QEMU's user owns
	// it: hugetlbfs has no ACLs); nil: none is granted.
	Hugetlbfs func(vm *spec.VM) (string, error)
	// VFIO is the host's sysfs and /dev, where a VM's host devices' nodes
	// are found (/dev/vfio/vfio and each IOMMU group's).
	VFIO   vfio.Host
	Logger *slog.Logger
	// OpenDisk opens a disk's image and backing chain beneath the host's
	// places and checks the objects (hostpaths.Places.OpenDisk); nil, nil
	// for a disk with no image file to open. Its grants are made through
	// those descriptors. nil: disks are granted by name.
	OpenDisk func(ctx context.Context, d spec.Disk) (*storage.OpenedDisk, error)
	// DiskPlace is the place a disk file lies in (hostpaths.Places.DiskPlace):
	// a hot-plugged disk's files are opened beneath it and granted by object.
	DiskPlace storage.Placer
	// OpenFile opens a boot file beneath its place and checks the object
	// (hostpaths.Places.OpenFile): what the boot files are copied from.
	OpenFile func(field, path string) (*os.File, error)
}

// SharedQEMUUser is the one system user all VMs' QEMUs run as when asked
// for (Options.QEMUUser = "vmsup-qemu"): fewer users on the host, but one
// VM's QEMU can then open every file granted to another's.
const SharedQEMUUser = "vmsup-qemu"

// DefaultQEMUUser is the default: a user per VM.
const DefaultQEMUUser = PerVMUser

// PerVMUser as Options.QEMUUser gives each VM its own system user,
// "vmsupq-" and 10 hex digits of the SHA-256 of the state root and the VM's
// name (useradd allows 32 bytes, VM names have 64), so VMs cannot reach
// each other's files even without AppArmor, nor two VMs of one name under
// two state roots (two fleets, a test and production) each other's. The
// user's comment (GECOS) names its root and VM. systemd 252 refuses a
// numeric User= without a passwd entry (status 217/USER, measured), hence
// real users; they are kept when a VM goes, so a later user never inherits
// files by a reused uid.
//
// A QEMU that runs keeps the user it was started as: Identity answers
// from the VM's confinement record while there is one, so a VM started by
// a vmsup that named users after the VM alone keeps that user for its
// hot-plugged taps and grants until it stops, and gets its root's own user
// at its next start (its state directory is given to the new user then, as
// at every start).
const PerVMUser = "per-vm"

// UserName is the per-VM user of VM vm under the state root root.
func UserName(root, vm string) string {
	h := sha256.Sum256([]byte(filepath.Clean(root) + "\x00" + vm))
	return "vmsupq-" + hex.EncodeToString(h[:5])
}

// UserComment is the comment (GECOS) of the per-VM user of vm under root,
// "" when root cannot be written there.
func UserComment(root, vm string) string {
	if strings.ContainsAny(root, ":,\n \t") {
		return ""
	}
	return "vmsup " + filepath.Clean(root) + " " + vm
}

// qemuUserName is the user a new QEMU of VM vm runs as.
func (m *Manager) qemuUserName(vm string) string {
	if m.QEMUUser != PerVMUser {
		return m.QEMUUser
	}
	return UserName(m.Root, vm)
}

// Record is what vmsup did to confine one VM's QEMU, kept in
// Root/security/NAME.json.
type Record struct {
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
	// The object granted (through its descriptor), found again by these
	// and never by the name alone (objects.go).
	Object *grantObject `json:"object,omitempty"`
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
	byFD              bool // QEMU gets it as a descriptor: no grant, no bind
	// file is the checked object to grant through (nil: by name); place
	// the directory it was opened beneath.
	file  *os.File
	place string
}

func (m *Manager) securityDir() string { return filepath.Join(m.Root, "security") }
func (m *Manager) securityRecord(name string) string {
	return filepath.Join(m.securityDir(), name+".json")
}

// Check is what Validate checks of the confinement: the "required"
// refusals, without touching anything.
func (m *Manager) Check(ctx context.Context, f *spec.File, p vmstore.Paths, accel spec.Accel) error {
	if f.VM.Security.AppArmor != spec.AppArmorRequired {
		return nil
	}
	needs, err := m.vmNeeds(ctx, f, p, accel)
	if err != nil {
		return err
	}
	defer closeNeeds(needs)
	if err := m.checkImageDirs(f, needs); err != nil {
		return err
	}
	if why := m.AppArmorUnusable; why != "" {
		return f.Errorf("security.apparmor", "\"required\" but %s: refusing to start VM %q unconfined", why, f.VM.Name)
	}
	return nil
}

// Confine gives the QEMU of f's VM what it needs and nothing more (f is the
// VM as it boots, with disks carried over from earlier attaches) and
// records it: the user, the state directory, ACL entries, the AppArmor
// profile. A previous run's leftovers are released first.
func (m *Manager) Confine(ctx context.Context, f *spec.File, p vmstore.Paths, accel spec.Accel) (*Record, error) {
	vm := &f.VM
	// The default image directory is where disks hot-plugged later must
	// lie (the unit binds it at start): make sure it exists.
	if def := filepath.Join(m.Root, "images"); slices.Contains(m.ImageDirs, def) {
		if err := os.MkdirAll(def, 0o711); err != nil { // QEMU users may search it, not list it
			return nil, err
		}
	}
	// A previous run that crashed may have left its grants: release them.
	// Its user stays: the host steps before this one (taps) asked
	// Identity, which answered from that record.
	prev, _ := m.Read(vm.Name)
	if err := m.Teardown(ctx, vm.Name); err != nil {
		return nil, err
	}
	needs, err := m.vmNeeds(ctx, f, p, accel)
	if err != nil {
		return nil, err
	}
	defer closeNeeds(needs)
	mode := vm.Security.AppArmor
	aaWhy := m.AppArmorUnusable
	if err := m.Check(ctx, f, p, accel); err != nil {
		return nil, err
	}
	qu, uid, gid, err := m.identityOf(ctx, prev, vm.Name)
	if err != nil {
		return nil, err
	}
	c := &Record{User: qu, UID: uid, GID: gid, Seccomp: vm.Security.HasSeccomp(),
		AppArmor: appArmorRecord{Mode: mode}}
	ok := false
	defer func() {
		if !ok {
			m.release(c)
		}
	}()
	if err := m.giveStateDir(c, p); err != nil {
		return nil, err
	}
	unlock, err := m.lock(ctx)
	if err != nil {
		return nil, err
	}
	err = m.grantNeeds(vm.Name, c, needs)
	unlock()
	if err != nil {
		return nil, err
	}
	switch {
	case mode == spec.AppArmorOff:
		c.AppArmor.Reason = "security.apparmor is \"off\""
	case aaWhy != "":
		c.AppArmor.Reason = aaWhy
	default:
		if err := m.loadProfile(ctx, c, vm, p, needs); err != nil {
			return nil, err
		}
	}
	if err := m.writeConfinement(vm.Name, c); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// vmNeeds lists every host path the VM's QEMU and stop hook use.
func (m *Manager) vmNeeds(ctx context.Context, f *spec.File, p vmstore.Paths, accel spec.Accel) ([]need, error) {
	vm := &f.VM
	ns, err := m.diskNeeds(ctx, f, p.Dir)
	if err != nil {
		return nil, err
	}
	// The kernel and initrd are QEMU's copies in the state directory
	// (bootfiles.go): no need of their own.
	if fw := caps.BootCode(vm.Boot); fw != "" {
		ns = append(ns, need{path: fw, mode: "r", field: f.Path + ": boot.firmware"})
	}
	// The unit's ExecStop= runs vmsup itself as the QEMU user; both need
	// the state directory (the profile lists it on its own).
	ns = append(ns, need{path: m.Self, mode: "rx", field: "vmsup binary (stop hook)", noProfile: true},
		need{path: p.Dir, mode: "rwx", field: "state directory", noProfile: true})
	if accel == spec.AccelKVM {
		ns = append(ns, need{path: "/dev/kvm", mode: "rw", field: f.Path + ": accel kvm"})
	}
	for i, sh := range vm.Shares {
		// A trailing "/": the directory and all under it (AppArmor), and
		// search permission on it (its ACL entry).
		mode := "rw"
		if sh.ReadOnly {
			mode = "r"
		}
		ns = append(ns, need{path: sh.Path + "/", mode: mode, field: fmt.Sprintf("%s: share[%d].path", f.Path, i)})
	}
	if vm.Vsock.On() {
		ns = append(ns, need{path: "/dev/vhost-vsock", mode: "rw", field: f.Path + ": vsock"})
	}
	if mount := m.hugetlbfs(vm); mount != "" {
		// QEMU creates (and at once unlinks) its memory file there: a
		// directory need, so the profile has DIR/**; QEMU's user owns it
		// (no ACL: hugetlbfs has none).
		ns = append(ns, need{path: mount + "/", mode: "rw", field: f.Path + ": hugepages"})
	}
	if len(vm.HostDevs) > 0 {
		var addrs []string
		for _, h := range vm.HostDevs {
			addrs = append(addrs, h.Address)
		}
		// The container and each group's node: ACL, AppArmor rule and the
		// unit's DeviceAllow= (Sandbox) like /dev/kvm.
		nodes, err := m.VFIO.Nodes(addrs)
		if err != nil {
			return nil, fmt.Errorf("%s: hostdev: %w", f.Path, err)
		}
		for _, n := range nodes {
			ns = append(ns, need{path: n, mode: "rw", field: f.Path + ": hostdev"})
		}
	}
	for i, n := range vm.NICs {
		if n.Type != spec.NICUser { // taps opened by QEMU itself
			ns = append(ns, need{path: "/dev/net/tun", mode: "rw", field: fmt.Sprintf("%s: nic[%d]", f.Path, i)})
			break
		}
	}
	return ns, nil
}

// checkImageDirs enforces the image-directory rule of "required" mode: every
// disk image and backing file lies, after resolving symlinks, under one of
// Options.ImageDirs.
func (m *Manager) checkImageDirs(f *spec.File, ns []need) error {
	for _, n := range ns {
		if !n.disk {
			continue
		}
		inside, err := m.InImageDirs(n.path)
		if err != nil {
			return fmt.Errorf("%s: %w", n.field, err)
		}
		if !inside {
			return fmt.Errorf("%s: %s is outside the image directories (%s): security.apparmor = \"required\" confines QEMU to them",
				n.field, n.path, strings.Join(m.ImageDirs, ", "))
		}
	}
	return nil
}

// InImageDirs reports whether path (symlinks resolved) lies in one of the
// image directories.
func (m *Manager) InImageDirs(path string) (bool, error) {
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
	for _, d := range m.ImageDirs {
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

// Identity is the user QEMU of VM vm runs as, created if missing: what
// another host step needs before confine runs (a tap's owner, TUNSETOWNER).
// While the VM has a confinement record (its QEMU runs, or ran and was not
// torn down), that record's user.
func (m *Manager) Identity(ctx context.Context, vm string) (name string, uid, gid uint32, err error) {
	c, _ := m.Read(vm)
	return m.identityOf(ctx, c, vm)
}

// identityOf is Identity with the VM's record c (nil: none).
func (m *Manager) identityOf(ctx context.Context, c *Record, vm string) (name string, uid, gid uint32, err error) {
	if c != nil && c.User != "" && c.UID != 0 {
		return c.User, c.UID, c.GID, nil
	}
	name = m.qemuUserName(vm)
	comment := ""
	if m.QEMUUser == PerVMUser {
		comment = UserComment(m.Root, vm)
	}
	uid, gid, err = m.qemuUser(ctx, name, comment)
	return name, uid, gid, err
}

// qemuUser looks the QEMU user up and creates it as a system user if
// missing (as scripts/install-deps.sh does), with comment if not "".
func (m *Manager) qemuUser(ctx context.Context, name, comment string) (uint32, uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		args := []string{"--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"}
		if comment != "" {
			args = append(args, "--comment", comment)
		}
		out, cerr := exec.CommandContext(ctx, "useradd", append(args, name)...).CombinedOutput()
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
func (m *Manager) giveStateDir(c *Record, p vmstore.Paths) error {
	// The QMP lock is taken by vmsup commands and by the stop hook.
	if lf, err := os.OpenFile(p.QMPLock, os.O_CREATE|os.O_RDONLY, 0o600); err == nil {
		lf.Close()
	}
	// Everything in it, whatever the other concerns put there (a seed ISO,
	// disk secrets one level down): WalkDir does not follow symlinks.
	var paths []string
	err := filepath.WalkDir(p.Dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == filepath.Join(p.Dir, bootDir) {
			return fs.SkipDir // the boot files' copies stay root's (bootfiles.go)
		}
		if err == nil {
			paths = append(paths, path)
		}
		return err
	})
	if err != nil {
		return err
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

// grantNeeds gives the QEMU user search on every directory above each
// need's path and the permissions its mode asks for on it, adding ACL
// entries only where the user lacks them. Written ahead: the grants are
// recorded (with what each path had before) before any is made, so that a
// vmsup killed in between, or a record that cannot be written, never
// leaves a grant nothing knows of. Taking back a grant that was recorded
// but not made restores what the path has anyway.
func (m *Manager) grantNeeds(name string, c *Record, ns []need) error {
	type grant struct {
		path  string
		want  uint16
		file  *os.File
		place string
	}
	var plan []grant
	at := map[string]int{}
	add := func(path string, want uint16, n *need) {
		if !slices.Contains(c.Uses, path) {
			c.Uses = append(c.Uses, path)
		}
		if i, ok := at[path]; ok {
			plan[i].want |= want
			if n != nil && n.file != nil {
				plan[i].file, plan[i].place = n.file, n.place
			}
			return
		}
		at[path] = len(plan)
		g := grant{path: path, want: want}
		if n != nil {
			g.file, g.place = n.file, n.place
		}
		plan = append(plan, g)
	}
	for _, n := range ns {
		if n.byFD {
			continue
		}
		path := filepath.Clean(n.path)
		want := modeBits(n.mode)
		if strings.HasSuffix(n.path, "/") {
			want |= 1 // a directory QEMU works in
		}
		var chain []string
		for d := filepath.Dir(path); ; d = filepath.Dir(d) {
			chain = append([]string{d}, chain...)
			if d == "/" {
				break
			}
		}
		for _, d := range chain {
			add(d, 1, nil)
		}
		add(path, want, &n)
	}
	var todo []aclGrant
	var files []*os.File // todo's objects, nil where granted by name
	for _, g := range plan {
		ok, prev, err := lacks(g.path, g.file, c, g.want)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		ag := aclGrant{Path: g.path, Perm: g.want, Prev: prev}
		if g.file != nil {
			if ag.Object, err = objectOf(g.file, g.place); err != nil {
				return err
			}
		}
		todo = append(todo, ag)
		files = append(files, g.file)
	}
	if len(todo) == 0 {
		return nil
	}
	c.Grants = append(c.Grants, todo...)
	if err := m.writeConfinement(name, c); err != nil {
		c.Grants = c.Grants[:len(c.Grants)-len(todo)]
		return fmt.Errorf("record the grants before making them: %w", err)
	}
	for i, g := range todo {
		if err := grantOne(g, files[i], c); err != nil {
			return err
		}
	}
	return nil
}

func modeBits(mode string) uint16 {
	want := uint16(0)
	for _, l := range mode {
		switch l {
		case 'r':
			want |= 4
		case 'w':
			want |= 2
		case 'x':
			want |= 1
		}
	}
	return want
}

func (m *Manager) loadProfile(ctx context.Context, c *Record, vm *spec.VM, p vmstore.Paths, ns []need) error {
	prof, err := m.buildProfile(vm, p, ns)
	if err != nil {
		return err
	}
	c.Profile = prof
	return m.reloadProfile(ctx, vm.Name, c)
}

func (m *Manager) buildProfile(vm *spec.VM, p vmstore.Paths, ns []need) (*units.Profile, error) {
	prof := &units.Profile{Name: vmstore.ProfileName(vm.Name), Binary: m.QEMU, Network: len(vm.NICs) > 0}
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

// Profile returns the AppArmor profile vmsup loads for f where the kernel
// has AppArmor (disks with their backing chains, boot files, the state
// directory), whatever this host has.
func (m *Manager) Profile(ctx context.Context, f *spec.File, p vmstore.Paths, accel spec.Accel) (*units.Profile, error) {
	ns, err := m.vmNeeds(ctx, f, p, accel)
	if err != nil {
		return nil, err
	}
	defer closeNeeds(ns)
	return m.buildProfile(&f.VM, p, ns)
}

// reloadProfile writes the VM's profile and loads (or replaces) it.
func (m *Manager) reloadProfile(ctx context.Context, name string, c *Record) error {
	text, err := c.Profile.Render()
	if err != nil {
		return err
	}
	file := filepath.Join(m.securityDir(), name+".apparmor")
	if err := os.MkdirAll(m.securityDir(), 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(file, text, 0o600); err != nil {
		return err
	}
	if err := (units.Parser{}).Load(ctx, file); err != nil {
		return fmt.Errorf("load AppArmor profile %s: %w", c.Profile.Name, err)
	}
	c.AppArmor.Profile, c.AppArmor.File = c.Profile.Name, file
	return nil
}

// Sandbox is the VM's unit sandbox for a confinement record c: QEMU's
// user, the systemd sandbox, its files.
//
// The unit names a file only where no directory it binds holds it, and
// every such name is optional ("-"): a snapshot merge, a disk move or a
// detach deletes files the unit was started with, and a missing bind
// source fails every later spawn of the unit (the stop hooks with
// 226/NAMESPACE, so `systemctl stop` could not power the guest off).
func (m *Manager) Sandbox(f *spec.File, p vmstore.Paths, c *Record) *units.Sandbox {
	sb := &units.Sandbox{
		User: c.User, Group: c.User,
		ReadWritePaths: []string{p.Dir},
		BindPaths:      []string{p.Dir},
		// Other VMs' state directories (their QMP sockets!) belong to the
		// same user: hide them all and bind this VM's own back in.
		HidePaths:       []string{filepath.Dir(p.Dir)},
		HostNetwork:     len(f.VM.NICs) > 0 || f.VM.HasNetworkDisk(),
		AppArmorProfile: c.AppArmor.Profile,
	}
	dirs := []string{p.Dir}                       // bound whole, read-write
	if mount := m.hugetlbfs(&f.VM); mount != "" { // the guest's memory file
		dirs = append(dirs, mount)
	}
	// Disks hot-plugged later come from the image directories: the unit's
	// mount namespace is fixed at start, so they are visible and writable
	// there (each file still needs its ACL entry and profile rule).
	for _, d := range m.ImageDirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs[1:] {
		sb.ReadWritePaths = append(sb.ReadWritePaths, d)
		sb.BindPaths = append(sb.BindPaths, d)
	}
	bound := func(path string) bool {
		return slices.ContainsFunc(dirs, func(d string) bool { return path == d || strings.HasPrefix(path, d+"/") })
	}
	seen := map[string]bool{}
	for _, use := range c.Uses {
		if fi, err := os.Stat(use); err != nil || fi.IsDir() || seen[use] || bound(use) {
			continue
		}
		seen[use] = true
		if strings.HasPrefix(use, "/dev/") {
			sb.Devices = append(sb.Devices, units.DeviceRule{Path: use, Access: "rw"})
			continue
		}
		sb.BindPaths = append(sb.BindPaths, "-"+use)
	}
	for _, d := range f.VM.Disks {
		if !d.ReadOnly && d.File != "" && (d.Type == spec.DiskFile || d.Type == "") && !bound(d.File) && !m.byFD(d, p.Dir) {
			sb.ReadWritePaths = append(sb.ReadWritePaths, "-"+d.File)
		}
	}
	for _, sh := range f.VM.Shares {
		sb.BindPaths = append(sb.BindPaths, sh.Path)
		if !sh.ReadOnly {
			sb.ReadWritePaths = append(sb.ReadWritePaths, sh.Path)
		}
	}
	return sb
}

// hugetlbfs is the VM's directory for its hugepages, "" without them (or
// unknown: the start's own check reports a missing mount).
func (m *Manager) hugetlbfs(vm *spec.VM) string {
	if vm.Hugepages == "" || m.Hugetlbfs == nil {
		return ""
	}
	mount, err := m.Hugetlbfs(vm)
	if err != nil {
		return ""
	}
	return mount
}

// DiskRules are the files QEMU opens for d (its image and backing chain, a
// block device or an ISO), as confinement rules: what a disk hot-plug
// grants before blockdev-add.
func DiskRules(ctx context.Context, d spec.Disk) ([]units.PathRule, error) {
	files, err := storage.DiskFiles(ctx, d)
	rules := make([]units.PathRule, len(files))
	for i, f := range files {
		rules[i] = units.PathRule{Path: f.Path, Mode: f.Mode}
	}
	return rules, err
}
