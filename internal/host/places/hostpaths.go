// Package hostpaths is the allow-list of host places a VM file may name:
// where its images, boot files, seeds' files, shares, block devices and
// storage and network configuration files may lie on this host. A VM file
// can come from anyone who may write one (a fleet client writing to etcd
// reaches every host), and vmsup acts on it as root: it grants QEMU's user
// the files, hands block devices over as descriptors, copies secret files
// and builds seeds. So every host path of a VM is checked, after its
// symlinks and ".." are resolved, against the places the host configured
// (Places), and refused otherwise, naming the places.
//
// It owns the rule and the resolution; it does not know which command
// asks (validate, up, hotplug, import, fleet apply and each fleet agent all
// do) nor what the files are used for beyond their key.
package places

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// Default places, for a fresh install (the flags' and supervisor.Options'
// defaults; the image directories' default, ROOT/images, depends on the
// state root).
const (
	// DefaultAllowPaths holds the test guest scripts/build-guest.sh builds
	// (the demo boots it).
	DefaultAllowPaths = "/var/cache/vmsup"
	// DefaultBlockDirs are udev's and device-mapper's stable names.
	DefaultBlockDirs = "/dev/disk/by-id:/dev/disk/by-path:/dev/mapper"
	// DefaultConfigDirs are where Ceph, CNI and vmsup's own secrets live.
	DefaultConfigDirs = "/etc/ceph:/etc/cni/net.d:/etc/vmsup"
	// FirmwareDir is the distribution's OVMF: a boot.vars_template may be
	// one of its variable stores (they hold no host secret).
	FirmwareDir = "/usr/share/OVMF"
)

// ErrOutside is what every refusal wraps: a path outside the places its
// field may name.
var ErrOutside = errors.New("outside the places VM files may name")

// Places are the host places VM files may name. Empty entries are
// ignored; a directory that does not exist allows nothing more than its
// path says.
type Places struct {
	// ImageDirs: vmsup's image directories (--image-dir): images, ISOs,
	// backing files, kernels, initrds, UEFI variable templates, seeds'
	// files and share roots.
	ImageDirs []string
	// BlockDirs (--block-dir): a disk's file may be an entry of one of
	// these directories that is a block device (a symlink such as
	// /dev/disk/by-id/X leads to /dev/sdX: the entry must be in the
	// directory, the device anywhere).
	BlockDirs []string
	// ConfigDirs (--config-dir): disks' ceph_conf and secret_file, NICs'
	// cni_config. Kept apart from the image places, so that a VM file
	// cannot boot a host secret as a disk or initrd.
	ConfigDirs []string
	// AllowPaths (--allow-path): places the host allows for every field
	// beyond the above (directories, or single files).
	AllowPaths []string
	// Store is vmsup's image store (internal/imagestore), one of the image
	// places for every field but a disk's file: its images are shared
	// and read-only, a disk opens one as the base of its own overlay
	// (image = "ALIAS"), never as its file.
	Store string
}

// List splits a colon-separated list (a default above, or an environment
// variable's value).
func List(s string) []string { return filepath.SplitList(s) }

// kind is which places a field may name, by its key.
type kind int

const (
	kindImage    kind = iota // image places
	kindDiskFile             // image places, or a block device in a block directory
	kindFirmware             // image places, or the distribution's OVMF
	kindConfig               // configuration places
)

// kindOf is a key's kind by the place its spec field is tagged with
// (spec.PathPlace); a key no spec field names (a command's own) is an
// image place's.
func kindOf(field string) kind {
	switch place, _ := spec.PathPlace(field); place {
	case spec.PlaceDisk:
		return kindDiskFile
	case spec.PlaceFirmware:
		return kindFirmware
	case spec.PlaceConfig:
		return kindConfig
	}
	return kindImage
}

// Check returns nil when field (a key as errors name it: "disk[0].file",
// "boot.kernel", "nic[1].cni_config"; its last key decides the places)
// may name path on this host, else an error wrapping ErrOutside that says
// where path leads, the places allowed, and how to allow it:
// `/x/s.raw (leads to /etc/shadow) is outside the places VM files may name
// (image directories: /var/lib/vmsup/images; ...): move it there, or allow
// its directory on this host (--image-dir or --allow-path DIR)`.
func (p *Places) Check(field, path string) error {
	if path == "" {
		return nil
	}
	abs, err := absolute(path)
	if err != nil {
		return err
	}
	real, err := resolve(abs, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	k := kindOf(field)
	if inAny([]string{p.Store}, real) {
		if k == kindDiskFile {
			return fmt.Errorf("%s is in vmsup's image store: a disk opens a stored image only as the base of its own overlay "+
				"(image = \"ALIAS\" or \"sha256:HEX\" with the disk's own file), never as its file", path)
		}
		if k != kindConfig {
			return nil
		}
	}
	dirs := p.AllowPaths
	switch k {
	case kindConfig:
		dirs = append(dirs[:len(dirs):len(dirs)], p.ConfigDirs...)
	case kindFirmware:
		dirs = append(dirs[:len(dirs):len(dirs)], append(p.ImageDirs, FirmwareDir)...)
	default:
		dirs = append(dirs[:len(dirs):len(dirs)], p.ImageDirs...)
	}
	if inAny(dirs, real) {
		return nil
	}
	what := path
	if real != path {
		what = fmt.Sprintf("%s (leads to %s)", path, real)
	}
	if k == kindDiskFile {
		ok, inBlock := p.blockDevice(abs)
		if ok {
			return nil
		}
		if inBlock {
			what += " is not a block device, and"
		}
	}
	return fmt.Errorf("%s is %w (%s): move it there, or allow its directory on this host (%s)",
		what, ErrOutside, p.describe(k), hint(k))
}

// hint is the flag that allows a place for fields of kind k.
func hint(k kind) string {
	switch k {
	case kindConfig:
		return "--config-dir or --allow-path DIR"
	case kindDiskFile:
		return "--image-dir, --block-dir or --allow-path DIR"
	}
	return "--image-dir or --allow-path DIR"
}

// describe lists the places of kind k, by what they are.
func (p *Places) describe(k kind) string {
	var parts []string
	add := func(what string, dirs []string) {
		var ds []string
		for _, d := range dirs {
			if d != "" {
				ds = append(ds, d)
			}
		}
		if len(ds) > 0 {
			parts = append(parts, what+": "+strings.Join(ds, ", "))
		}
	}
	if k == kindConfig {
		add("configuration directories", p.ConfigDirs)
	} else {
		add("image directories", p.ImageDirs)
	}
	if k == kindFirmware {
		add("firmware", []string{FirmwareDir})
	}
	if k == kindDiskFile {
		add("block device directories", p.BlockDirs)
	}
	add("allowed", p.AllowPaths)
	if len(parts) == 0 {
		return "none configured"
	}
	return strings.Join(parts, "; ")
}

// blockDevice reports whether path is an entry of a block directory
// (inBlock; its own directory and ".." resolved, the entry itself not
// followed) and, if so, whether it leads to a block device or does not
// exist yet (ok; the storage check reports a missing device).
func (p *Places) blockDevice(path string) (ok, inBlock bool) {
	entry := path
	i := strings.LastIndexByte(path, '/')
	if base := path[i+1:]; base != "" && base != "." && base != ".." {
		dir, err := Resolve(path[:i] + "/")
		if err != nil {
			return false, false
		}
		entry = filepath.Join(dir, base)
	} else if r, err := Resolve(path); err == nil {
		entry = r
	}
	for _, d := range p.BlockDirs {
		if rd, err := Resolve(d); d != "" && err == nil && within(rd, entry) && rd != entry {
			inBlock = true
		}
	}
	if !inBlock {
		return false, false
	}
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, true
	}
	return err == nil && fi.Mode()&fs.ModeDevice != 0 && fi.Mode()&fs.ModeCharDevice == 0, true
}

// inAny reports whether real lies in one of dirs (each resolved too).
func inAny(dirs []string, real string) bool {
	for _, d := range dirs {
		if d == "" {
			continue
		}
		rd, err := Resolve(d)
		if err == nil && within(rd, real) {
			return true
		}
	}
	return false
}

// Within reports whether path, resolved, lies in dir (or is dir), also
// resolved: what "in an image directory" means for a running VM's new
// files.
func Within(dir, path string) (bool, error) {
	rd, err := Resolve(dir)
	if err != nil {
		return false, err
	}
	rp, err := Resolve(path)
	if err != nil {
		return false, err
	}
	return within(rd, rp), nil
}

// within: p is dir or below it; both clean and absolute.
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// maxLinks bounds the symlinks one resolution follows (Linux's 40).
const maxLinks = 40

// Resolve returns the absolute path the kernel would open for path: every
// symlink and ".." resolved in order. Where a part of path does not exist
// yet (an image created on demand), the rest is taken as written after the
// longest part that exists; a dangling symlink is followed to where it
// points (creating the file would create it there).
func Resolve(path string) (string, error) {
	abs, err := absolute(path)
	if err != nil {
		return "", err
	}
	return resolve(abs, 0)
}

// absolute is path against the working directory, not cleaned: "link/.."
// must stay for resolve to follow the link first.
func absolute(path string) (string, error) {
	if strings.HasPrefix(path, "/") {
		return path, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return wd + "/" + path, nil
}

func resolve(path string, links int) (string, error) {
	if links > maxLinks {
		return "", fmt.Errorf("%s: too many levels of symbolic links", path)
	}
	parts := strings.Split(path, "/") // absolute: parts[0] is ""
	for i := len(parts); i > 0; i-- {
		prefix := strings.Join(parts[:i], "/")
		if prefix == "" {
			prefix = "/"
		}
		rest := filepath.Join(parts[i:]...)
		if r, err := filepath.EvalSymlinks(prefix); err == nil {
			return filepath.Join(r, rest), nil
		}
		fi, err := os.Lstat(prefix)
		if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			continue // does not exist (or cannot be looked at): shorter
		}
		// A symlink EvalSymlinks could not follow: dangling.
		target, err := os.Readlink(prefix)
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(target, "/") {
			target = strings.Join(parts[:i-1], "/") + "/" + target
		}
		return resolve(target+"/"+rest, links+1)
	}
	return filepath.Clean(path), nil
}

// Field is one host path a VM file names, with its key as errors name it.
type Field struct {
	Name, Path string
}

// Fields are every host path vm names, in file order: each key its spec
// field tags `vmsup:"hostpath"` (spec.VM.HostPaths) that is set. Firmware
// code is vmsup's own choice (the distribution's), not the file's.
func Fields(vm *spec.VM) []Field { return set(vm.HostPaths()) }

// DiskFields are the host paths disk d names; prefix is its key
// ("disk[0]", or "" for a disk given alone: "file", "backing").
func DiskFields(prefix string, d spec.Disk) []Field { return set(d.HostPaths(prefix)) }

// set are the keys of ps that are set.
func set(ps []spec.HostPath) []Field {
	var out []Field
	for _, p := range ps {
		if *p.Ptr != "" {
			out = append(out, Field{p.Key, *p.Ptr})
		}
	}
	return out
}
