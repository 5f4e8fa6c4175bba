// Package hugepages reads the host's hugetlbfs facts a VM with hugepages
// starts from: the mount for a page size (/proc/self/mountinfo) and the free
// pages of that size (/sys/kernel/mm/hugepages). It reserves nothing and
// mounts nothing: pages are the administrator's to reserve (nr_hugepages),
// and the kernel reserves a VM's pages when its QEMU maps them.
package hugepages

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Host reads the facts below Root: "/" on a real host, a fake tree in tests.
type Host struct{ Root string }

func (h Host) path(p string) string { return filepath.Join(cmp.Or(h.Root, "/"), p) }

// ErrNoMount is wrapped by Mount when no hugetlbfs of the size is mounted.
var ErrNoMount = errors.New("no hugetlbfs mounted")

// PageName is a page size as the kernel names it in /sys
// ("hugepages-2048kB").
func PageName(page spec.Size) string { return fmt.Sprintf("hugepages-%dkB", page/spec.KiB) }

// Mount returns the mount point of a hugetlbfs with pages of size page:
// the first one in mountinfo (systemd mounts the default size at
// /dev/hugepages). A mount without a pagesize option has the kernel's
// default size (Hugepagesize in /proc/meminfo).
func (h Host) Mount(page spec.Size) (string, error) {
	f, err := os.Open(h.path("/proc/self/mountinfo"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	def := h.defaultSize()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 || b[0] != "hugetlbfs" {
			continue
		}
		size := def
		for _, o := range strings.Split(b[2], ",") {
			if v, ok := strings.CutPrefix(o, "pagesize="); ok {
				if size, err = spec.ParseSize(v); err != nil {
					size = 0
				}
			}
		}
		if size == page {
			return unescape(a[4]), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%w for %s pages (mount -t hugetlbfs -o pagesize=%s none DIR)", ErrNoMount, sizeName(page), sizeName(page))
}

// defaultSize is the kernel's default hugepage size; 2M when unreadable
// (x86's).
func (h Host) defaultSize() spec.Size {
	b, err := os.ReadFile(h.path("/proc/meminfo"))
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Hugepagesize:"); ok {
				f := strings.Fields(v)
				if n, err := strconv.ParseInt(f[0], 10, 64); err == nil && len(f) == 2 && f[1] == "kB" {
					return spec.Size(n) * spec.KiB
				}
			}
		}
	}
	return 2 * spec.MiB
}

// unescape undoes mountinfo's octal escapes ("\040" for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Pages are a page size's counts in /sys/kernel/mm/hugepages.
type Pages struct {
	Total, Free int64 // nr_hugepages, free_hugepages
}

// Count reads the pages of size page.
func (h Host) Count(page spec.Size) (Pages, error) {
	dir := h.path("/sys/kernel/mm/hugepages/" + PageName(page))
	var p Pages
	for _, f := range []struct {
		name string
		n    *int64
	}{{"nr_hugepages", &p.Total}, {"free_hugepages", &p.Free}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if errors.Is(err, os.ErrNotExist) {
			return p, fmt.Errorf("this kernel has no %s hugepages (no %s)", sizeName(page), dir)
		}
		if err != nil {
			return p, err
		}
		if *f.n, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return p, fmt.Errorf("%s: %w", filepath.Join(dir, f.name), err)
		}
	}
	return p, nil
}

// Check is what a start of vm checks: a hugetlbfs of its page size is
// mounted and the host has free pages for its boot memory. It returns the
// mount (qemuargs.Options.Hugetlbfs). Memory hot-plugged later needs pages
// then; QEMU's object-add fails cleanly without them.
func (h Host) Check(vm *spec.VM) (string, error) {
	page := vm.HugepageSize()
	if page == 0 {
		return "", nil
	}
	mount, err := h.Mount(page)
	if err != nil {
		return "", err
	}
	pages, err := h.Count(page)
	if err != nil {
		return "", err
	}
	if need := int64(vm.Memory / page); pages.Free < need {
		return "", fmt.Errorf("%s needs %d free %s pages, the host has %d free (echo %d > /sys/kernel/mm/hugepages/%s/nr_hugepages)",
			vm.Memory, need, vm.Hugepages, pages.Free, pages.Total+need-pages.Free, PageName(page))
	}
	return mount, nil
}

// sizeName is "2M" or "1G".
func sizeName(page spec.Size) string {
	if page%spec.GiB == 0 {
		return fmt.Sprintf("%dG", page/spec.GiB)
	}
	return fmt.Sprintf("%dM", page/spec.MiB)
}

// VMDir is the VM's own directory on a hugetlbfs mount, where its QEMU
// creates the guest's memory files. hugetlbfs has no POSIX ACLs, so QEMU's
// user is given a directory it owns (as libvirt does), not an ACL entry
// on the mount; the mount's root needs only search permission for others
// (its default mode, 0755).
func VMDir(mount, vm string) string { return filepath.Join(mount, "vmsup-"+vm) }

// DirOf is the VM's directory on the hugetlbfs mount of its page size,
// where its QEMU maps the guest's memory.
func (h Host) DirOf(vm *spec.VM) (string, error) {
	mount, err := h.Mount(vm.HugepageSize())
	if err != nil {
		return "", err
	}
	return VMDir(mount, vm.Name), nil
}

// MakeVMDir makes the VM's directory on mount, owned by uid:gid, 0700,
// and returns it; an existing one gets that owner and mode.
func MakeVMDir(mount, vm string, uid, gid int) (string, error) {
	dir := VMDir(mount, vm)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("hugepages: %w", err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return "", fmt.Errorf("hugepages: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("hugepages: %w", err)
	}
	return dir, nil
}

// RemoveVMDirs removes the VM's directories on every hugetlbfs mount (its
// QEMU is gone; the files in them went with it). Idempotent.
func (h Host) RemoveVMDirs(vm string) error {
	var errs []error
	for _, page := range []spec.Size{2 * spec.MiB, spec.GiB} {
		m, err := h.Mount(page)
		if err != nil {
			continue
		}
		if err := os.Remove(VMDir(m, vm)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
