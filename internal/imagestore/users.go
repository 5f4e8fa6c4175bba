package imagestore

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/storage"
)

// usersTimeout bounds the look at every VM's backing chains.
const usersTimeout = 2 * time.Minute

// Users returns a UsersFunc over the VMs of the state store st: for each
// stored image (by path), the VMs whose disks open it, through the disk's
// overlay, its snapshots' overlays (every image of the VM's snapshot
// tree), or, before the overlay was made, the image its `image` key
// names: `VM "web" (disk "root")`; and the qcow2 files of ScanDirs that
// no VM opens, by their backing chains: `image file PATH` (scanUsers).
func (s Store) Users(st vmstore.Store) UsersFunc {
	return func(ctx context.Context) (map[string][]string, error) {
		ctx, cancel := context.WithTimeout(ctx, usersTimeout)
		defer cancel()
		names, err := st.Known()
		if err != nil {
			return nil, err
		}
		out := map[string][]string{}
		byID := s.idPaths()
		opened := map[string]bool{}
		add := func(path, who string) {
			opened[path] = true
			if p, ok := byID[storage.ImageID(path)]; ok {
				path = p // the stored image under another name (a symlink, a relative backing name)
			}
			if !slices.Contains(out[path], who) {
				out[path] = append(out[path], who)
			}
		}
		for _, n := range names {
			v, err := st.View(n)
			if err != nil {
				continue // no record: it opens nothing
			}
			for _, d := range v.Disks {
				who := fmt.Sprintf("VM %q (disk %q)", n, d.Name)
				for _, p := range s.diskImages(ctx, d, v) {
					add(p, who)
				}
			}
			for _, p := range v.Tree.Files() {
				for _, b := range chain(ctx, p) {
					add(b, fmt.Sprintf("VM %q (a snapshot)", n))
				}
			}
		}
		s.scanUsers(ctx, opened, add)
		return out, nil
	}
}

// idPaths maps the stored images' storage.ImageID to their paths.
func (s Store) idPaths() map[string]string {
	ims, _ := s.List()
	m := map[string]string{}
	for _, im := range ims {
		m[storage.ImageID(im.Path)] = im.Path
	}
	return m
}

// diskImages are the files a disk of v opens or will open.
func (s Store) diskImages(ctx context.Context, d vmstore.Disk, v *vmstore.View) []string {
	if d.Type != spec.DiskFile {
		return nil
	}
	var out []string
	for _, p := range d.Images(v.Tree) {
		out = append(out, chain(ctx, p)...)
	}
	if d.Image != "" {
		if im, err := s.Resolve(d.Image); err == nil {
			out = append(out, im.Path)
		}
	}
	return out
}

// chain is the image at path and its bases (none when unreadable).
func chain(ctx context.Context, path string) []string {
	files, err := storage.DiskFiles(ctx, spec.Disk{Type: spec.DiskFile, Format: spec.FormatQcow2, File: path})
	if err != nil {
		return []string{path}
	}
	var out []string
	for _, f := range files {
		out = append(out, f.Path)
	}
	return out
}
