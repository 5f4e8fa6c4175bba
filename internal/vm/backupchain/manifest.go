// Package backup keeps the bookkeeping of vmsup's backups, apart from
// QEMU: a backup directory holds, per disk, a chain of qcow2 files (a full
// one, then incremental ones each with the previous as its backing file)
// and DIR/manifest.json, which lists the points, their files and their
// checksums. It plans each point (full or incremental, and why) from the
// manifest and the dirty bitmaps the disk's image holds.
package backupchain

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// ManifestName is the manifest's file name in a backup directory.
const ManifestName = "manifest.json"

// Modes of a disk's point.
const (
	Full        = "full"
	Incremental = "incremental"
)

// Manifest is DIR/manifest.json: one VM's backup points, oldest first.
type Manifest struct {
	Version int    `json:"version"`
	VM      string `json:"vm"`
	UUID    string `json:"uuid,omitempty"`
	// Chain identifies this directory's chain: the VM's dirty bitmaps for
	// it are named after it (BitmapName), so two directories never share
	// one.
	Chain  string  `json:"chain"`
	Points []Point `json:"points"`
}

// Point is one backup: every disk at the same moment.
type Point struct {
	N    int       `json:"n"`
	Time time.Time `json:"time"`
	Live bool      `json:"live"` // taken from a running VM
	// Quiesced says how the guest's filesystems were made consistent at
	// the point ("fsfreeze (N filesystems)") or why it is crash-consistent.
	Quiesced string      `json:"quiesced,omitempty"`
	Disks    []DiskPoint `json:"disks"`
}

// DiskPoint is one disk's file of a point.
type DiskPoint struct {
	Disk string `json:"disk"`
	File string `json:"file"` // in the directory
	Mode string `json:"mode"` // Full or Incremental
	// Reason says why the point is full when an incremental one was asked
	// for or the disk had one before.
	Reason  string `json:"reason,omitempty"`
	Backing string `json:"backing,omitempty"` // the previous point's file (incremental)
	Size    int64  `json:"size"`              // the disk's virtual size
	// Copied is the guest data the point's file holds (its allocated,
	// non-zero extents): what was really copied, all of the disk's data or
	// what changed since the previous point.
	Copied int64  `json:"copied"`
	SHA256 string `json:"sha256"` // of File as written
	// Image is the image the point was copied from: the disk's active
	// image (after moves, on a snapshot's overlay) at the time.
	Image string `json:"image,omitempty"`
}

// New is the manifest of an empty directory for VM vm.
func New(vm, uuid string) *Manifest {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return &Manifest{Version: 1, VM: vm, UUID: uuid, Chain: hex.EncodeToString(b)}
}

// Load reads dir's manifest; nil (and no error) when dir has none.
func Load(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestName), err)
	}
	if m.Version != 1 || m.VM == "" || m.Chain == "" {
		return nil, fmt.Errorf("%s: not a vmsup backup manifest (version %d)", filepath.Join(dir, ManifestName), m.Version)
	}
	return &m, nil
}

// Save writes the manifest into dir atomically (owner-only): a crash
// leaves the old one or the new one.
func (m *Manifest) Save(dir string) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, ManifestName), append(b, '\n'), 0o600)
}

// Owned checks that the directory's chain is VM vm's (uuid "" matches any).
func (m *Manifest) Owned(dir, vm, uuid string) error {
	if m.VM != vm || (uuid != "" && m.UUID != "" && m.UUID != uuid) {
		return fmt.Errorf("backup directory %s holds the chain of VM %q (uuid %s), not of this one: use another directory", dir, m.VM, m.UUID)
	}
	return nil
}

// Next is the number of the next point.
func (m *Manifest) Next() int {
	if len(m.Points) == 0 {
		return 1
	}
	return m.Points[len(m.Points)-1].N + 1
}

// Find is point n, nil if there is none.
func (m *Manifest) Find(n int) *Point {
	for i := range m.Points {
		if m.Points[i].N == n {
			return &m.Points[i]
		}
	}
	return nil
}

// Last is disk's latest point (its number and file), or nil.
func (m *Manifest) Last(disk string) (int, *DiskPoint) {
	for i := len(m.Points) - 1; i >= 0; i-- {
		for j := range m.Points[i].Disks {
			if m.Points[i].Disks[j].Disk == disk {
				return m.Points[i].N, &m.Points[i].Disks[j]
			}
		}
	}
	return 0, nil
}

// HasFull says whether any point holds a full backup (an incremental one
// needs one to build on).
func (m *Manifest) HasFull() bool {
	for _, p := range m.Points {
		for _, d := range p.Disks {
			if d.Mode == Full {
				return true
			}
		}
	}
	return false
}

// FileName is the file of disk's point n.
func FileName(disk string, n int) string { return fmt.Sprintf("%s.%04d.qcow2", disk, n) }

// BitmapPrefix starts the name of every dirty bitmap of chain.
func BitmapPrefix(chain string) string { return "vmsup-backup-" + chain + "-" }

// BitmapName is the dirty bitmap that records the writes since point n of
// chain: made in the same transaction as the point's copy, so it holds
// exactly what the next incremental point must copy.
func BitmapName(chain string, n int) string { return fmt.Sprintf("%s%d", BitmapPrefix(chain), n) }
