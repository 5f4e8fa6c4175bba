package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// SeedLabel is the volume label cloud-init's NoCloud source looks for.
const SeedLabel = "cidata"

// BuildSeed writes a NoCloud seed ISO at path holding files (name ->
// content: "user-data", "meta-data", "network-config"), labelled cidata.
func BuildSeed(path string, files map[string][]byte) error {
	return BuildISO(path, SeedLabel, files)
}

// BuildISO writes an ISO9660 image at path with the volume label and the
// files (name -> content) in its root, with Rock Ridge so the guest sees the
// names as written. It writes a temporary file in the same directory and
// renames it into place, so path is never half-written.
func BuildISO(path, label string, files map[string][]byte) error {
	dir := filepath.Dir(path)
	work, err := os.MkdirTemp(dir, ".seed-work-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tmp := filepath.Join(work, "seed.iso")
	var size int64 = 1 << 20 // system area, descriptors, directories
	for _, b := range files {
		size += (int64(len(b))/2048 + 1) * 2048
	}
	b, err := file.CreateFromPath(tmp, size)
	if err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	defer b.Close()
	tree := filepath.Join(work, "tree") // go-diskfs stages the files here
	if err := os.Mkdir(tree, 0o700); err != nil {
		return err
	}
	fs, err := iso9660.Create(b, size, 0, 2048, tree)
	if err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f, err := fs.OpenFile("/"+n, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return fmt.Errorf("seed %s: %s: %w", path, n, err)
		}
		if _, err := f.Write(files[n]); err != nil {
			return fmt.Errorf("seed %s: %s: %w", path, n, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("seed %s: %s: %w", path, n, err)
		}
	}
	if err := fs.Finalize(iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: label}); err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	if err := b.Close(); err != nil {
		return err
	}
	if err := padVolumeID(tmp); err != nil {
		return fmt.Errorf("seed %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// padVolumeID pads the primary volume descriptor's volume identifier with
// spaces, as ECMA-119 wants; go-diskfs pads it with NULs, which blkid
// tolerates but stricter readers show as part of the label.
func padVolumeID(path string) error {
	const off, n = 16*2048 + 40, 32 // sector 16, bytes 40..71
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	id := make([]byte, n)
	if _, err := f.ReadAt(id, off); err != nil {
		return err
	}
	for i, c := range id {
		if c == 0 {
			id[i] = ' '
		}
	}
	if _, err := f.WriteAt(id, off); err != nil {
		return err
	}
	return f.Close()
}
