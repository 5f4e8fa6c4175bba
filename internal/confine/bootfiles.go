package confine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/atomicfile"
	"github.com/vmsup/vmsup/internal/hostcaps"
	"github.com/vmsup/vmsup/internal/startplan"
	"github.com/vmsup/vmsup/internal/steps"
	"github.com/vmsup/vmsup/internal/vmstate"
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
// first start. The copies go when the VM stops (RemoveBootFiles).

// BootStep is the start step that copies the boot files, before the
// confine step gives the state directory to QEMU's user.
const BootStep = "boot-files"

// bootDir is the state directory's entry holding the copies.
const bootDir = "boot"

// bootStep copies f's boot files into the start's state directory and
// has the start boot from the copies; its undo removes what it made.
func (s Start) bootStep(f *spec.File, plan *startplan.Plan) steps.Step {
	var madeVars bool
	return steps.Step{Name: BootStep, Do: func(context.Context) error {
		b, err := s.Manager().CopyBootFiles(f, plan.Paths, plan.Mode == startplan.Fresh, false)
		plan.Boot.Kernel, plan.Boot.Initrd, madeVars = b.Kernel, b.Initrd, b.MadeVars
		return err
	}, Undo: func(context.Context) {
		_ = RemoveBootFiles(plan.Paths)
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
// at most the guest's memory, and with firstVars a UEFI VM's variable
// store from its template where it has none yet. reuse keeps the copies
// there are (a local migration's new QEMU boots from the running one's)
// and gives the ones it makes to the state directory's owner. Errors name
// the field.
func (m *Manager) CopyBootFiles(f *spec.File, p vmstate.Paths, firstVars, reuse bool) (BootCopies, error) {
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
		if reuse {
			if err := chownLikeDir(dir, boot); err != nil {
				return out, err
			}
		}
	}
	if firstVars && vm.Boot.Firmware == spec.FirmwareUEFI {
		out.MadeVars, err = m.copyVars(dir, filepath.Base(p.UEFIVars), vm.Boot, max)
	}
	return out, err
}

// copyBootFile copies path (field's) into boot as name, or with reuse
// keeps a regular file there is.
func (m *Manager) copyBootFile(boot *os.File, field, path, name string, max int64, reuse bool) error {
	var st unix.Stat_t
	if reuse && unix.Fstatat(int(boot.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		return nil
	}
	src, err := m.OpenFile(field, path)
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	defer src.Close()
	if _, err := atomicfile.CopyAt(boot, name, src, 0o600, max); err != nil {
		return fmt.Errorf("%s: %w (the guest's memory)", field, err)
	}
	return nil
}

// copyVars makes the UEFI variable store name in dir from its template
// (the file's vars_template, else the distribution's) where there is none
// (a symlink there is QEMU's own doing: left alone, never followed).
func (m *Manager) copyVars(dir *os.File, name string, b spec.Boot, max int64) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); !errors.Is(err, unix.ENOENT) {
		return false, err
	}
	tmpl := hostcaps.VarsTemplate(b)
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

// openBootDir opens (making it if missing) the directory of the copies in
// the state directory dir, following no symlink: an entry there that is
// no directory (QEMU's user owns the state directory and may have put one
// there) is replaced.
func openBootDir(dir *os.File) (*os.File, error) {
	dfd := int(dir.Fd())
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for try := 0; ; try++ {
		if err := unix.Mkdirat(dfd, bootDir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("make %s/%s: %w", dir.Name(), bootDir, err)
		}
		fd, err := unix.Openat2(dfd, bootDir, &how)
		if err == nil {
			return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), bootDir)), nil
		}
		if try > 0 || !(errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)) {
			return nil, fmt.Errorf("open %s/%s: %w", dir.Name(), bootDir, err)
		}
		if err := unix.Unlinkat(dfd, bootDir, 0); err != nil {
			return nil, fmt.Errorf("replace %s/%s: %w", dir.Name(), bootDir, err)
		}
	}
}

// chownLikeDir gives boot and what is in it the owner of the state
// directory dir (QEMU's user, who opens the copies).
func chownLikeDir(dir, boot *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(dir.Fd()), &st); err != nil {
		return err
	}
	for _, name := range []string{"kernel", "initrd"} {
		err := unix.Fchownat(int(boot.Fd()), name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("give %s/%s to the state directory's owner: %w", boot.Name(), name, err)
		}
	}
	return unix.Fchownat(int(dir.Fd()), bootDir, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW)
}

// RemoveBootFiles removes the boot files' copies from p's state directory
// (once QEMU is gone: it read them at its start), following no symlink.
func RemoveBootFiles(p vmstate.Paths) error {
	return os.RemoveAll(filepath.Join(p.Dir, bootDir))
}
