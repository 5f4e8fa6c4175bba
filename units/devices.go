package units

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// A unit started with a sandbox has a private, read-only /dev holding only
// the nodes it was given, and a closed device policy: a device hot-plugged
// later (a host PCI device's /dev/vfio group node) must be added to both.
// systemd 252 cannot do the first (BindMountUnit refuses a device node,
// EINVAL; a node inside a directory bound at start is refused on open,
// measured), so, as libvirt does, the node is made inside the unit's mount
// namespace.

// nodeScript makes node $1 (type $3, major $4, minor $5) in directory $2,
// owned by uid $6, mode 0600, in the mount namespace it runs in, unless it
// is there (a node bound in at start is the host's own), with /dev
// writable only meanwhile. (That namespace's /proc need not show the
// script: a sandbox's is its own PID namespace's, ProcSubset=pid.)
const nodeScript = `set -e
if ! touch /dev/.vmsup-rw 2>/dev/null; then
	mount -o remount,rw /dev
	trap 'mount -o remount,ro /dev' EXIT
fi
rm -f /dev/.vmsup-rw
mkdir -p "$2"
if [ ! -e "$1" ]; then
	mknod "$1" "$3" "$4" "$5"
	chown "$6" "$1"
	chmod 0600 "$1"
fi`

// rmScript removes node $1 likewise.
const rmScript = `set -e
if ! touch /dev/.vmsup-rw 2>/dev/null; then
	mount -o remount,rw /dev
	trap 'mount -o remount,ro /dev' EXIT
fi
rm -f /dev/.vmsup-rw
rm -f "$1"`

// AddDevice lets the running unit name, whose main process is pid (as this
// process sees it), open the host's device node node: the node is allowed
// in its device cgroup (for as long as the unit runs) and, when the unit
// has a mount namespace of its own, made there, owned by uid.
func (m *Manager) AddDevice(ctx context.Context, name string, pid int, node string, uid int) error {
	var st unix.Stat_t
	if err := unix.Stat(node, &st); err != nil {
		return fmt.Errorf("unit %s: device %s: %w", name, node, err)
	}
	kind := "c"
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFCHR:
	case syscall.S_IFBLK:
		kind = "b"
	default:
		return fmt.Errorf("unit %s: %s is not a device node", name, node)
	}
	type rule struct{ Path, Access string }
	if err := m.conn.SetUnitPropertiesContext(ctx, name, true, prop("DeviceAllow", []rule{{node, "rw"}})); err != nil {
		return fmt.Errorf("unit %s: allow %s: %w", name, node, err)
	}
	own, err := ownMountNS(pid)
	if err != nil || !own {
		return err // the host's /dev: the node is there
	}
	maj, min := unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))
	return inMountNS(ctx, pid, nodeScript, node, filepath.Dir(node), kind,
		strconv.FormatUint(uint64(maj), 10), strconv.FormatUint(uint64(min), 10), strconv.Itoa(uid))
}

// RemoveDevice removes node from the mount namespace of pid (a unit's
// main process) after its device was unplugged. Its device cgroup keeps
// the rule until the unit ends (systemd drops no single rule at run time);
// without the node, nothing opens it by path.
func RemoveDevice(ctx context.Context, pid int, node string) error {
	own, err := ownMountNS(pid)
	if err != nil || !own {
		return err
	}
	return inMountNS(ctx, pid, rmScript, node)
}

// ownMountNS reports whether pid has a mount namespace other than ours.
func ownMountNS(pid int) (bool, error) {
	theirs, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return false, fmt.Errorf("mount namespace of pid %d: %w", pid, err)
	}
	ours, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return false, err
	}
	return theirs != ours, nil
}

// inMountNS runs script with args in pid's mount namespace (nsenter: a Go
// process cannot setns(CLONE_NEWNS) once it has threads).
func inMountNS(ctx context.Context, pid int, script string, args ...string) error {
	argv := append([]string{"-t", strconv.Itoa(pid), "-m", "--", "/bin/sh", "-c", script, "sh"}, args...)
	if out, err := exec.CommandContext(ctx, "nsenter", argv...).CombinedOutput(); err != nil {
		return fmt.Errorf("in the mount namespace of pid %d: %w: %s", pid, err, out)
	}
	return nil
}
