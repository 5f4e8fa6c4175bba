package machine

import (
	"context"
	"fmt"
	"strings"

	hostpaths "github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/spec"
)

// Places are the host Places VM files may name here (Options).
func (s *Env) Places() *hostpaths.Places {
	return &hostpaths.Places{ImageDirs: s.opts.ImageDirs, BlockDirs: s.opts.BlockDirs,
		ConfigDirs: s.opts.ConfigDirs, AllowPaths: s.opts.AllowPaths, Store: imagestore.Dir(s.opts.Root)}
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
func (s *Env) CheckPath(field, path string) error {
	return s.Places().Check(field, path)
}

// CheckPaths checks every host path f names against this host's places
// (Options.ImageDirs, BlockDirs, ConfigDirs, AllowPaths), after symlinks
// and "..", and the bases an existing qcow2 image's header names (QEMU
// opens them too): one error per key outside them, at its place in f
// (f.Join). Keys with a problem in f itself are skipped. Validate (so up,
// apply and restart) checks it first; a fleet agent checks each spec it
// is given with it before anything else.
func (s *Env) CheckPaths(ctx context.Context, f *spec.File) error {
	_, err := s.Places().CheckFile(ctx, f)
	return err
}

// checkPaths is CheckPaths, also returning the keys it refused.
func (s *Env) checkPaths(ctx context.Context, f *spec.File) (refused []string, err error) {
	return s.Places().CheckFile(ctx, f)
}

// CheckDisk checks a disk given alone (vmsup import asks it of each disk
// it would write) as up would: its host paths against the places, and
// its image and backing chain opened beneath them as objects (one link,
// no external data file, no protocol base), connecting nowhere.
func (s *Env) CheckDisk(ctx context.Context, d spec.Disk) error {
	return s.Places().CheckDisk(ctx, d)
}

// CheckDiskPaths is CheckPaths for a disk given alone (hostpaths CheckDisk).
func (s *Env) CheckDiskPaths(ctx context.Context, d spec.Disk) error {
	return s.Places().CheckDisk(ctx, d)
}

// Reachable checks that a running VM can open new files at paths: its
// unit's mount namespace was fixed at start and sees only the image
// directories (bound then) among new files, not /tmp or /home.
func (s *Env) Reachable(paths ...string) error {
	if path := s.Unreachable(paths...); path != "" {
		return fmt.Errorf("%s is outside the image directories (%s), the only places a running VM can open new images; move it there, or add the disk to the VM's file and restart",
			path, strings.Join(s.opts.ImageDirs, ", "))
	}
	return nil
}

// Unreachable is the first of paths a running VM cannot open (reachable),
// "" when it can open them all.
func (s *Env) Unreachable(paths ...string) string {
	for _, path := range paths {
		if path == "" {
			continue
		}
		if in, err := s.Confiner().InImageDirs(path); err != nil || !in {
			return path
		}
	}
	return ""
}
