package backupchain

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Sum is the sha256 of file path, in hex, after it is synced to disk.
func Sum(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("sync %s: %w", path, err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// ChainTo is disk's files that point n reads, n's first, down to the
// full one.
func (m *Manifest) ChainTo(disk string, n int) ([]DiskPoint, error) {
	p := m.Find(n)
	if p == nil {
		return nil, fmt.Errorf("no point %d in %s (the last is %d)", n, ManifestName, m.Next()-1)
	}
	d := p.disk(disk)
	if d == nil {
		return nil, fmt.Errorf("point %d has no disk %q", n, disk)
	}
	out := []DiskPoint{*d}
	for i := len(m.Points) - 1; i >= 0 && d.Mode != Full; i-- {
		if m.Points[i].N >= n {
			continue
		}
		if b := m.Points[i].disk(disk); b != nil && b.File == d.Backing {
			d = b
			out = append(out, *d)
		}
	}
	if d.Mode != Full {
		return nil, fmt.Errorf("disk %q: the chain of point %d breaks at %s (its backing %s is not in %s)", disk, n, d.File, d.Backing, ManifestName)
	}
	return out, nil
}

func (p *Point) disk(name string) *DiskPoint {
	for i := range p.Disks {
		if p.Disks[i].Disk == name {
			return &p.Disks[i]
		}
	}
	return nil
}

// Verify checks the checksums of the files in chain, in dir.
func Verify(dir string, chain []DiskPoint) error {
	for _, d := range chain {
		p := filepath.Join(dir, d.File)
		sum, err := sumReadOnly(p)
		if err != nil {
			return err
		}
		if sum != d.SHA256 {
			return fmt.Errorf("%s: checksum mismatch (sha256 %s, the manifest says %s): the file is damaged", p, sum, d.SHA256)
		}
	}
	return nil
}

func sumReadOnly(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
