package imagestore

import (
	"context"
	"io/fs"
	"path/filepath"
	"strings"
)

// A disk image that no VM record names any more (a kept disk of a removed
// VM, a file the user made with qemu-img) may still be an overlay on a
// stored image: removing the image would leave it unopenable. The scan
// reads the qcow2 headers (from descriptors, storage's readers: nothing is
// run or connected to) of the files in the image directories.

// Scan bounds: a directory tree of the user's must not stall image rm.
const (
	scanMaxFiles = 10000
	scanMaxDepth = 4
)

// scanUsers adds, for each qcow2 file under s.ScanDirs not already a VM's
// (skip), the images its backing chain opens: "image file PATH".
func (s Store) scanUsers(ctx context.Context, skip map[string]bool, add func(path, who string)) {
	seen := 0
	for _, dir := range s.ScanDirs {
		dir, err := filepath.Abs(dir)
		if err != nil || strings.HasPrefix(dir+"/", s.Dir+"/") {
			continue
		}
		filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil || ctx.Err() != nil || seen >= scanMaxFiles {
				return filepath.SkipDir
			}
			if e.IsDir() {
				if strings.Count(strings.TrimPrefix(p, dir), "/") >= scanMaxDepth {
					return filepath.SkipDir
				}
				return nil
			}
			seen++
			if !e.Type().IsRegular() || skip[p] {
				return nil
			}
			for _, b := range chain(ctx, p)[1:] { // none: not a qcow2 overlay
				add(b, "image file "+p)
			}
			return nil
		})
	}
}
