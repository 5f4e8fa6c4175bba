package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/spec"
)

// FileUse is one host file QEMU opens for a disk, with how: "rwk" (read,
// write, lock) or "rk".
type FileUse struct {
	Path string
	Mode string
}

// DiskFiles lists the host files QEMU opens for disk d: an image file and
// its whole backing chain (bases only read), a block device or an ISO.
// Network disks open no host file but an RBD disk's ceph_conf, and a seed's ISO and disk secrets live
// in the VM's state directory. What confinement must grant.
func DiskFiles(ctx context.Context, d spec.Disk) ([]FileUse, error) {
	switch d.Type {
	case spec.DiskRBD:
		if d.CephConf != "" { // librados reads it inside QEMU
			return []FileUse{{Path: d.CephConf, Mode: "r"}}, nil
		}
		return nil, nil
	case spec.DiskISCSI, spec.DiskSeed:
		return nil, nil
	case spec.DiskBlock, spec.DiskISO:
		m := "rwk"
		if d.ReadOnly || d.Type == spec.DiskISO {
			m = "rk"
		}
		return []FileUse{{Path: d.File, Mode: m}}, nil
	}
	chain := []string{d.File}
	if d.Format == spec.FormatQcow2 {
		var err error
		if chain, err = backingChain(ctx, d.File); err != nil {
			return nil, err
		}
	}
	var out []FileUse
	for j, file := range chain {
		m := "rwk"
		if d.ReadOnly || j > 0 { // bases of a chain are only read
			m = "rk"
		}
		out = append(out, FileUse{Path: file, Mode: m})
	}
	return out, nil
}

// backingChain returns the image and every file below it, top first, as
// qemu-img reads them (so a relative backing name resolves as QEMU will).
// -U: the image may be in use by its running VM (a profile printed for it).
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

// ImageID names the host object behind path, to find one image under two
// names: a block device by its device number (any /dev name of it), a
// file by its filesystem and inode (through symlinks, "..", hard links),
// and a file not there yet by its clean path with the directory's
// symlinks resolved.
func ImageID(path string) string {
	if path == "" {
		return ""
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			return fmt.Sprintf("block device %d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
		return fmt.Sprintf("file %d:%d", st.Dev, st.Ino)
	}
	dir, base := filepath.Split(filepath.Clean(path))
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return "path " + filepath.Join(dir, base)
}
