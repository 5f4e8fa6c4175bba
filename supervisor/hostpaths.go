package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/hostpaths"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// chainTimeout bounds reading one image's backing chain for the check.
const chainTimeout = 30 * time.Second

// places are the host places VM files may name here (Options).
func (s *Supervisor) places() *hostpaths.Places {
	return &hostpaths.Places{ImageDirs: s.opts.ImageDirs, BlockDirs: s.opts.BlockDirs,
		ConfigDirs: s.opts.ConfigDirs, AllowPaths: s.opts.AllowPaths}
}

// orDefaults is v, or the colon-separated list def when v is empty.
func orDefaults(v []string, def string) []string {
	if len(v) == 0 {
		return hostpaths.List(def)
	}
	return v
}

// CheckPath reports whether a VM file's key (as errors name it:
// "disk[0].file", "boot.kernel", "nic[0].cni_config"; its last key decides
// the places) may name path on this host, symlinks and ".." resolved: nil,
// or one line saying where path leads and the places allowed. What vmsup
// import asks of each path it would write.
func (s *Supervisor) CheckPath(field, path string) error {
	return s.places().Check(field, path)
}

// CheckPaths checks every host path f names against this host's places
// (Options.ImageDirs, BlockDirs, ConfigDirs, AllowPaths), after symlinks
// and "..", and the bases an existing qcow2 image's header names (QEMU
// opens them too): one error per key outside them, at its place in f
// (f.Join). Keys with a problem in f itself are skipped. Validate (so up,
// apply and restart) checks it first; a fleet agent checks each spec it
// is given with it before anything else.
func (s *Supervisor) CheckPaths(ctx context.Context, f *spec.File) error {
	_, err := s.checkPaths(ctx, f)
	return err
}

// checkPaths is CheckPaths, also returning the keys it refused.
func (s *Supervisor) checkPaths(ctx context.Context, f *spec.File) (refused []string, err error) {
	p := s.places()
	var errs []error
	for _, fl := range hostpaths.Fields(&f.VM) {
		if f.Broken(fl.Name) {
			continue
		}
		if err := p.Check(fl.Name, fl.Path); err != nil {
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
			errs = append(errs, f.Errorf(disk+".file", "%v", err))
			refused = append(refused, disk+".file")
		}
	}
	return refused, f.Join(errs...)
}

// checkDiskPaths is CheckPaths for a disk given alone (hot-plug, a move's
// target, a disk attached earlier that a start boots with): the error
// names the key ("file: /etc/shadow is outside ...").
func (s *Supervisor) checkDiskPaths(ctx context.Context, d spec.Disk) error {
	p := s.places()
	for _, fl := range hostpaths.DiskFields("", d) {
		if err := p.Check(fl.Name, fl.Path); err != nil {
			return fmt.Errorf("%s: %w", fl.Name, err)
		}
	}
	if err := checkChain(ctx, p, d); err != nil {
		return fmt.Errorf("file: %w", err)
	}
	return nil
}

// checkChain checks the bases of d's image, when it is an existing qcow2
// image: its header, which whoever could write the image wrote, names them
// (a guest that wrote a qcow2 header into a raw disk it had could name
// /etc/shadow). One that is missing is created at start on the disk's
// backing key, which is checked as a key; an unreadable chain is the
// storage check's to report.
func checkChain(ctx context.Context, p *hostpaths.Places, d spec.Disk) error {
	if d.Type != spec.DiskFile || d.Format != spec.FormatQcow2 {
		return nil
	}
	if _, err := os.Stat(d.File); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, chainTimeout)
	defer cancel()
	files, err := storage.DiskFiles(ctx, d)
	if err != nil || len(files) < 2 {
		return nil
	}
	above := d.File
	for _, b := range files[1:] {
		path := b.Path
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(above), path) // as QEMU takes a relative base
		}
		if err := p.Check("backing", path); err != nil {
			return fmt.Errorf("%s's base image %w", d.File, err)
		}
		above = path
	}
	return nil
}

// withoutFields drops from err (a check's *spec.Error or *spec.Errors)
// the problems of fields, of keys inside them and of the tables holding
// them: a key outside the host's places is refused, what else is wrong
// with what it names follows from that (and is not looked at as root).
func withoutFields(err error, fields []string) error {
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

// reachable checks that a running VM can open new files at paths: its
// unit's mount namespace was fixed at start and sees only the image
// directories (bound then) among new files, not /tmp or /home.
func (s *Supervisor) reachable(paths ...string) error {
	if path := s.unreachable(paths...); path != "" {
		return fmt.Errorf("%s is outside the image directories (%s), the only places a running VM can open new images; move it there, or add the disk to the VM's file and restart",
			path, strings.Join(s.opts.ImageDirs, ", "))
	}
	return nil
}

// unreachable is the first of paths a running VM cannot open (reachable),
// "" when it can open them all.
func (s *Supervisor) unreachable(paths ...string) string {
	for _, path := range paths {
		if path == "" {
			continue
		}
		if in, err := s.confiner().InImageDirs(path); err != nil || !in {
			return path
		}
	}
	return ""
}
