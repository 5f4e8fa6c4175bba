package places

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// CheckFile checks every host path f names against the places, after
// symlinks and "..", and the bases an existing qcow2 image's header names
// (QEMU opens them too): one error per key outside them, at its place in f
// (f.Join), and the keys refused. Keys with a problem in f itself are
// skipped.
func (p *Places) CheckFile(ctx context.Context, f *spec.File) (refused []string, err error) {
	var errs []error
	for _, fl := range Fields(&f.VM) {
		if f.Broken(fl.Name) {
			continue
		}
		if err := p.Check(fl.Name, fl.Path); err != nil {
			errs = append(errs, f.Errorf(fl.Name, "%v", err))
			refused = append(refused, fl.Name)
		}
	}
	for _, fl := range Fields(&f.VM) {
		if !strings.HasPrefix(fl.Name, "boot.") || f.Broken(fl.Name) || slices.Contains(refused, fl.Name) {
			continue
		}
		if err := checkBootFile(p, fl); err != nil {
			errs = append(errs, f.Errorf(fl.Name, "%v", err))
			refused = append(refused, fl.Name)
		}
	}
	for i, d := range f.VM.Disks {
		disk := fmt.Sprintf("disk[%d]", i)
		if f.Broken(disk) || slices.ContainsFunc(refused, func(r string) bool { return strings.HasPrefix(r, disk+".") }) {
			continue
		}
		if err := checkChain(ctx, p, d); err != nil {
			errs = append(errs, f.Errorf(disk+".file", "vm %q: disk %q: %v", f.VM.Name, d.Name, err))
			refused = append(refused, disk+".file")
		}
	}
	return refused, f.Join(errs...)
}

// CheckDisk is CheckFile for a disk given alone (hot-plug, a move's
// target, a disk attached earlier that a start boots with): the error
// names the key ("file: /etc/shadow is outside ...").
func (p *Places) CheckDisk(ctx context.Context, d spec.Disk) error {
	for _, fl := range DiskFields("", d) {
		if err := p.Check(fl.Name, fl.Path); err != nil {
			return fmt.Errorf("%s: %w", fl.Name, err)
		}
	}
	if err := checkChain(ctx, p, d); err != nil {
		return fmt.Errorf("file: %w", err)
	}
	return nil
}

// checkChain opens d's image and the bases its headers name as QEMU will
// be given them (OpenDisk) and closes them: a check of the objects, not of
// names. A missing image is created at start on the disk's backing key,
// which is checked as a key.
func checkChain(ctx context.Context, p *Places, d spec.Disk) error {
	o, err := p.OpenDisk(ctx, d)
	if errors.Is(err, ErrNoObject) {
		return nil
	}
	o.Close()
	return err
}

// checkBootFile opens a boot file as a start copies it (OpenFile) and
// closes it: a check of the object. A missing file is the host check's
// to report (hostcaps: "no such file").
func checkBootFile(p *Places, fl Field) error {
	f, err := p.OpenFile(fl.Name, fl.Path)
	if errors.Is(err, fs.ErrNotExist) && !statExists(fl.Path) {
		return nil
	}
	if err != nil {
		return err
	}
	return f.Close()
}

// ErrNoObject is OpenDisk's answer for a disk with no image file of its own
// to open now: a network or seed disk, a block device, an image made at
// start.
var ErrNoObject = errors.New("no image file to open")

// OpenDisk opens the image of d (type file, or an ISO in an image place)
// and its whole backing chain, each level beneath the place it lies in
// with no symlink on the way, and checks the opened objects
// (storage.OpenDisk): one link, the owner, the qcow2 header read from the
// descriptor. Nothing is connected to and no program runs. The caller
// closes the result (or hands its descriptors on).
func (p *Places) OpenDisk(ctx context.Context, d spec.Disk) (*storage.OpenedDisk, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	switch {
	case d.File == "":
		return nil, ErrNoObject
	case d.Type == spec.DiskISO:
		if _, err := p.DiskPlace(d.File, false); err != nil {
			return nil, ErrNoObject // a block device's ISO: its entry is checked by name
		}
	case d.Type != spec.DiskFile:
		return nil, ErrNoObject
	}
	abs, err := absolute(d.File)
	if err != nil {
		return nil, err
	}
	d.File = filepath.Clean(abs)
	o, err := storage.OpenDisk(d, p.DiskPlace, storage.OpenLimits{})
	if errors.Is(err, fs.ErrNotExist) && !statExists(d.File) {
		return nil, ErrNoObject
	}
	return o, err
}

// statExists: something is at path (a missing top is made at start; a
// missing base is the chain's error).
func statExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// DiskPlace is the place path (absolute, clean) lies in as written, no
// symlink resolved: an image directory or allowed place, or for a base
// (base true) also the image store. The opener then refuses any symlink
// beneath it. Outside them: the error Check gives, or says the path
// reaches its place through a symlink.
func (p *Places) DiskPlace(path string, base bool) (string, error) {
	dirs := append(append([]string{}, p.ImageDirs...), p.AllowPaths...)
	field := "file"
	if base {
		dirs, field = append(dirs, p.Store), "backing"
	}
	return p.placeIn(dirs, field, path)
}

// placeIn is the first of dirs path (absolute, clean) lies in as written,
// for field: an allowed single file is opened beneath its own directory
// (the name is that file's and no other). Outside them: Check's error, or
// that path reaches its place through a symlink.
func (p *Places) placeIn(dirs []string, field, path string) (string, error) {
	for _, d := range dirs {
		if d == "" {
			continue
		}
		for _, dd := range []string{filepath.Clean(d), resolvedOr(d)} {
			switch {
			case dd == path && slices.Contains(p.AllowPaths, d):
				fi, err := os.Lstat(dd)
				if err == nil && fi.Mode().IsRegular() {
					return filepath.Dir(dd), nil
				}
				if err == nil && fi.IsDir() {
					return "", fmt.Errorf("%s is a directory", path)
				}
			case within(dd, path) && dd != path:
				return dd, nil
			}
		}
	}
	if err := p.Check(field, path); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s is in its place only through a symlink (%w): name the file itself", path, storage.ErrNotBeneath)
}

// OpenFile opens a boot file a VM file names (field "boot.kernel",
// "boot.initrd" or "boot.vars_template": its places are Check's for the
// field, the image store among them) beneath the place it lies in as
// written, read-only, and checks the object (storage.OpenFile: a regular
// file with one link, no QEMU user's). The caller copies it from the
// descriptor for QEMU, and closes it.
func (p *Places) OpenFile(field, path string) (*os.File, error) {
	abs, err := absolute(path)
	if err != nil {
		return nil, err
	}
	abs = filepath.Clean(abs)
	dirs := append(append([]string{}, p.ImageDirs...), p.AllowPaths...)
	dirs = append(dirs, p.Store)
	if kindOf(field) == kindFirmware {
		dirs = append(dirs, FirmwareDir)
	}
	place, err := p.placeIn(dirs, field, abs)
	if err != nil {
		return nil, err
	}
	f, _, err := storage.OpenFile(place, abs)
	return f, err
}

func resolvedOr(dir string) string {
	if r, err := Resolve(dir); err == nil {
		return r
	}
	return filepath.Clean(dir)
}

// WithoutFields drops from err (a check's *spec.Error or *spec.Errors)
// the problems of fields, of keys inside them and of the tables holding
// them: a key outside the host's places is refused, what else is wrong
// with what it names follows from that (and is not looked at as root).
func WithoutFields(err error, fields []string) error {
	if err == nil || len(fields) == 0 {
		return err
	}
	keep := func(e *spec.Error) bool {
		for _, f := range fields {
			if e.Field != "" && (e.Field == f || strings.HasPrefix(f, e.Field+".") || strings.HasPrefix(e.Field, f+".") || strings.HasPrefix(e.Field, f+"[")) {
				return false
			}
		}
		return true
	}
	switch e := err.(type) {
	case *spec.Error:
		if !keep(e) {
			return nil
		}
	case *spec.Errors:
		var list []*spec.Error
		for _, x := range e.List {
			if keep(x) {
				list = append(list, x)
			}
		}
		switch len(list) {
		case 0:
			return nil
		case 1:
			return list[0]
		}
		return &spec.Errors{List: list}
	}
	return err
}
