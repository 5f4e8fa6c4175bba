package confine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/host/caps"
	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
)

// Boot files (issue 45). QEMU opens -kernel and -initrd by name, as its
// user; a grant on that name gives whatever object the name leads to then
// (a hard link to a root-only host file is one such), and a unit that
// names a file an operation deletes fails its next spawn. So vmsup opens
// the kernel and initrd itself, beneath the place each lies in and
// following no symlink (Manager.OpenFile), checks the object (a regular
// file with one link that no QEMU user owns), and copies the content from
// that descriptor into the VM's state directory (DIR/boot), which QEMU
// boots from: the originals get no ACL entry, no bind and no profile rule,
// and deleting or changing one while the VM runs touches nothing of it. A
// UEFI VM's variable store is made from its template the same way at its
// first start.
//
// The copies are root's (0644 in a 0755 directory root owns: QEMU's user
// reads them and cannot change them, so a compromised QEMU cannot leave
// its next boot a kernel of its own) and stay between runs, each marked
// with the source object it was copied from (sourceXattr): a start that
// finds its checked source unchanged (device, inode, size, mtime, ctime)
// keeps the copy instead of copying the file again (the test guest's 71 MB
// cost ~40-130 ms of each start on a loaded 2-core host). They go with the
// state directory (vmsup rm).

// BootStep is the start step that copies the boot files, before the
// confine step gives the state directory to QEMU's user.
const BootStep = "boot-files"

// bootDir is the state directory's entry holding the copies.
const bootDir = "boot"

// sourceXattr is a copy's record of the object it was copied from. A
// trusted.* attribute: only a process with CAP_SYS_ADMIN (vmsup, never
// QEMU) can set or read it.
const sourceXattr = "trusted.vmsup.source"

// bootStep copies f's boot files into the start's state directory and
// has the start boot from the copies; its undo removes a variable store
// it made (the copies stay, for the next start to keep).
func (s Start) bootStep(f *spec.File, plan *startplan.Plan) steps.Step {
	var madeVars bool
	return steps.Step{Name: BootStep, Do: func(context.Context) error {
		b, err := s.Manager().CopyBootFiles(f, plan.Paths, plan.Mode == startplan.Fresh, false)
		plan.Boot.Kernel, plan.Boot.Initrd, madeVars = b.Kernel, b.Initrd, b.MadeVars
		return err
	}, Undo: func(context.Context) {
		if madeVars {
			os.Remove(plan.Paths.UEFIVars)
		}
	}}
}

// BootCopies are the copies a start boots from.
type BootCopies struct {
	Kernel, Initrd string // "" where the file names none
	MadeVars       bool   // the UEFI variable store was made from its template
}

// CopyBootFiles copies f's kernel and initrd into p's state directory
// (DIR/boot/kernel, DIR/boot/initrd) from their checked descriptors, each
// at most the guest's memory, keeping a copy already made from the same
// unchanged object; and with firstVars a UEFI VM's variable store from
// its template where it has none yet. reuse keeps any copy of root's
// there is without opening the source (a local migration's new QEMU boots
// from the running one's copies, whose sources may be gone). Errors name
// the field.
func (m *Manager) CopyBootFiles(f *spec.File, p vmstore.Paths, firstVars, reuse bool) (BootCopies, error) {
	var out BootCopies
	vm := &f.VM
	if m.OpenFile == nil {
		return out, errors.New("no opener for boot files")
	}
	dir, err := os.OpenFile(p.Dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return out, err
	}
	defer dir.Close()
	max := int64(vm.Memory)
	if vm.Boot.Kernel != "" {
		boot, err := openBootDir(dir)
		if err != nil {
			return out, err
		}
		defer boot.Close()
		for _, b := range []struct {
			field, path, name string
			copy              *string
		}{{"boot.kernel", vm.Boot.Kernel, "kernel", &out.Kernel}, {"boot.initrd", vm.Boot.Initrd, "initrd", &out.Initrd}} {
			if b.path == "" {
				continue
			}
			if err := m.copyBootFile(boot, b.field, b.path, b.name, max, reuse); err != nil {
				return out, err
			}
			*b.copy = filepath.Join(p.Dir, bootDir, b.name)
		}
	}
	if firstVars && vm.Boot.Firmware == spec.FirmwareUEFI {
		out.MadeVars, err = m.copyVars(dir, filepath.Base(p.UEFIVars), vm.Boot, max)
	}
	return out, err
}

// copyBootFile copies path (field's) into boot as name, unless the copy
// there was made from the same unchanged object (or, with reuse, is
// root's).
func (m *Manager) copyBootFile(boot *os.File, field, path, name string, max int64, reuse bool) error {
	if reuse {
		if c, _, err := openCopy(boot, name); err == nil {
			c.Close()
			return nil
		}
	}
	src, err := m.OpenFile(field, path)
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	id := fmt.Sprintf("%d:%d:%d:%d.%09d:%d.%09d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	if c, cst, err := openCopy(boot, name); err == nil {
		buf := make([]byte, 128)
		n, xerr := unix.Fgetxattr(int(c.Fd()), sourceXattr, buf)
		c.Close()
		if xerr == nil && string(buf[:n]) == id && cst.Size == st.Size {
			return nil
		}
	}
	if _, err := atomicfile.CopyAt(boot, name, src, 0o644, max); err != nil {
		return fmt.Errorf("%s: %w (the guest's memory)", field, err)
	}
	// Without the mark (a file system without trusted.* attributes) the
	// next start copies again.
	if c, _, err := openCopy(boot, name); err == nil {
		_ = unix.Fsetxattr(int(c.Fd()), sourceXattr, []byte(id), 0)
		c.Close()
	}
	return nil
}

// openCopy opens the copy name in boot, following no symlink, if it is a
// regular file of root's with one link.
func openCopy(boot *os.File, name string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(int(boot.Fd()), name, &how)
	if err != nil {
		return nil, st, err
	}
	c := os.NewFile(uintptr(fd), filepath.Join(boot.Name(), name))
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Nlink != 1 {
		c.Close()
		return nil, st, fmt.Errorf("%s is not a copy of vmsup's", c.Name())
	}
	return c, st, nil
}

// copyVars makes the UEFI variable store name in dir from its template
// (the file's vars_template, else the distribution's) where there is none
// (a symlink there is QEMU's own doing: left alone, never followed).
func (m *Manager) copyVars(dir *os.File, name string, b spec.Boot, max int64) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); !errors.Is(err, unix.ENOENT) {
		return false, err
	}
	tmpl := caps.VarsTemplate(b)
	if b.VarsTemplate == "" { // the distribution's, vmsup's own choice: by what its name leads to
		if real, err := filepath.EvalSymlinks(tmpl); err == nil {
			tmpl = real
		}
	}
	src, err := m.OpenFile("boot.vars_template", tmpl)
	if err != nil {
		return false, fmt.Errorf("UEFI variable store: boot.vars_template: %w", err)
	}
	defer src.Close()
	if _, err := atomicfile.CopyAt(dir, name, src, 0o600, max); err != nil {
		return false, fmt.Errorf("UEFI variable store: %w", err)
	}
	return true, nil
}

// errNotRoots is a boot directory another user than root owns.
var errNotRoots = errors.New("is not root's")

// openBootDir opens (making it if missing) the directory of the copies in
// the state directory dir, following no symlink: root's, 0755. Anything
// else there (QEMU's user owns the state directory and may have put it
// there) is removed first.
func openBootDir(dir *os.File) (*os.File, error) {
	path := filepath.Join(dir.Name(), bootDir)
	for try := 0; ; try++ {
		f, err := openRootDir(dir, bootDir)
		if err == nil {
			return f, nil
		}
		if try > 0 || !(errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, errNotRoots)) {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		if err := os.RemoveAll(path); err != nil { // never follows a symlink
			return nil, fmt.Errorf("replace %s: %w", path, err)
		}
	}
}

// openRootDir opens (making it if missing) the directory name in dir,
// following no symlink, if root owns it, and makes it 0755.
func openRootDir(dir *os.File, name string) (*os.File, error) {
	dfd := int(dir.Fd())
	if err := unix.Mkdirat(dfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, err
	}
	how := unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(dfd, name, &how)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), name))
	var st unix.Stat_t
	if err = unix.Fstat(fd, &st); err == nil && st.Uid != 0 {
		err = errNotRoots
	}
	if err == nil {
		err = f.Chmod(0o755) // not the umask's
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
