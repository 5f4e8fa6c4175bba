package diskops

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/vmsup/vmsup/internal/vm/backupchain"
)

// RestoreOptions say which backup point becomes which new image.
type RestoreOptions struct {
	Dir    string // the backup directory
	Disk   string // "" when the backups hold one disk
	Point  int    // 0: the last one
	To     string // the new image; must not exist
	Format string // "raw" or "qcow2" (default)
}

// RestoreResult reports a restore.
type RestoreResult struct {
	Dir      string        `json:"dir"`
	Disk     string        `json:"disk"`
	Point    int           `json:"point"`
	To       string        `json:"to"`
	Format   string        `json:"format"`
	Chain    []string      `json:"chain"` // the files read, the point's first
	Duration time.Duration `json:"duration_ns"`
}

// Restore verifies the checksums of the chain up to a point and writes
// the disk as it was then into a new image (qemu-img convert). It needs
// no VM: the result is an image file to attach or boot from.
func (s *Service) Restore(ctx context.Context, o RestoreOptions) (RestoreResult, error) {
	res := RestoreResult{Dir: o.Dir, Disk: o.Disk, Point: o.Point, To: o.To, Format: o.Format}
	fail := func(err error) (RestoreResult, error) { return res, fmt.Errorf("restore from %s: %w", o.Dir, err) }
	switch {
	case res.Format == "":
		res.Format = "qcow2"
	case res.Format != "qcow2" && res.Format != "raw":
		return fail(fmt.Errorf("--format %q: want raw or qcow2", res.Format))
	}
	if o.To == "" {
		return fail(errors.New("no target image (--to FILE)"))
	}
	if _, err := os.Lstat(o.To); err == nil {
		return fail(fmt.Errorf("--to %s exists: restore writes a new image only", o.To))
	}
	m, err := backupchain.Load(o.Dir)
	if err == nil && m == nil {
		err = fmt.Errorf("%s has no %s: not a backup directory", o.Dir, backupchain.ManifestName)
	}
	if err != nil {
		return fail(err)
	}
	if res.Point == 0 {
		res.Point = m.Next() - 1
	}
	if res.Disk == "" {
		if res.Disk, err = onlyDisk(m, res.Point); err != nil {
			return fail(err)
		}
	}
	chain, err := m.ChainTo(res.Disk, res.Point)
	if err != nil {
		return fail(err)
	}
	for _, d := range chain {
		res.Chain = append(res.Chain, d.File)
	}
	if err := backupchain.Verify(o.Dir, chain); err != nil {
		return fail(err)
	}
	start := time.Now()
	if err := s.env.Tools().Convert(ctx, filepath.Join(o.Dir, chain[0].File), "qcow2", o.To, res.Format, false); err != nil {
		return fail(fmt.Errorf("disk %q point %d: %w", res.Disk, res.Point, err))
	}
	res.Duration = time.Since(start)
	return res, nil
}

// onlyDisk is the disk of point n when it has one; else an error listing
// them.
func onlyDisk(m *backupchain.Manifest, n int) (string, error) {
	p := m.Find(n)
	if p == nil {
		return "", fmt.Errorf("no point %d in %s (the last is %d)", n, backupchain.ManifestName, m.Next()-1)
	}
	var names []string
	for _, d := range p.Disks {
		names = append(names, d.Disk)
	}
	sort.Strings(names)
	if len(names) != 1 {
		return "", fmt.Errorf("point %d holds disks %v: say which with --disk", n, names)
	}
	return names[0], nil
}
