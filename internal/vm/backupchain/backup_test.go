package backupchain

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func point(m *Manifest, disks ...DiskPlan) {
	n := m.Next()
	p := Point{N: n}
	for _, d := range disks {
		p.Disks = append(p.Disks, DiskPoint{Disk: d.Disk, File: d.File, Mode: d.Mode, Backing: d.Backing, Size: d.Size, SHA256: "x"})
	}
	m.Points = append(m.Points, p)
}

func TestPlan(t *testing.T) {
	m := New("vm", "u")
	d := Disk{Name: "data", Image: "/i/data.qcow2", Format: "qcow2", Size: 64 << 20}
	p := m.Plan(1, true, d)
	if p.Mode != Full || !strings.Contains(p.Reason, "no earlier backup") || p.NewBitmap != BitmapName(m.Chain, 1) || p.File != "data.0001.qcow2" {
		t.Fatalf("first plan: %+v", p)
	}
	point(m, p)
	// The bitmap of point 1 is there: incremental.
	d.Bitmaps = []Bitmap{{Name: BitmapName(m.Chain, 1), Persistent: true, Recording: true}, {Name: BitmapName(m.Chain, 0), Persistent: true}, {Name: "other"}}
	p = m.Plan(2, true, d)
	if p.Mode != Incremental || p.Reason != "" || p.Since != BitmapName(m.Chain, 1) || p.Backing != "data.0001.qcow2" {
		t.Fatalf("incremental plan: %+v", p)
	}
	if len(p.Drop) != 1 || p.Drop[0] != BitmapName(m.Chain, 0) {
		t.Fatalf("drop %v, want only the stale bitmap of this chain", p.Drop)
	}
	// Not asked for: full, no reason, the bitmap of point 1 kept until it succeeds.
	if p := m.Plan(2, false, d); p.Mode != Full || p.Reason != "" || len(p.Drop) != 1 {
		t.Fatalf("full plan: %+v", p)
	}
	for _, c := range []struct {
		name string
		edit func(*Disk)
		want string
	}{
		{"inconsistent", func(d *Disk) { d.Bitmaps[0].Inconsistent = true }, "inconsistent"},
		{"missing", func(d *Disk) { d.Bitmaps = nil }, "missing"},
		{"raw", func(d *Disk) { d.Format = "raw" }, "raw image"},
		{"resized", func(d *Disk) { d.Size *= 2 }, "resized"},
	} {
		dd := d
		dd.Bitmaps = append([]Bitmap(nil), d.Bitmaps...)
		c.edit(&dd)
		p := m.Plan(2, true, dd)
		if p.Mode != Full || !strings.Contains(p.Reason, c.want) {
			t.Errorf("%s: %+v, want full because %s", c.name, p, c.want)
		}
		if c.name == "inconsistent" && len(p.Drop) != 2 {
			t.Errorf("inconsistent: drop %v, want it dropped too", p.Drop)
		}
		if c.name == "raw" && p.NewBitmap != "" {
			t.Errorf("raw: a new bitmap %s", p.NewBitmap)
		}
	}
}

func TestChainAndManifest(t *testing.T) {
	dir := t.TempDir()
	if m, err := Load(dir); m != nil || err != nil {
		t.Fatalf("Load of an empty dir = %v, %v", m, err)
	}
	m := New("vm", "u")
	files := map[string]string{}
	add := func(mode, backing string) {
		n := m.Next()
		f := FileName("data", n)
		os.WriteFile(filepath.Join(dir, f), []byte(f), 0o600)
		sum, err := Sum(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = sum
		m.Points = append(m.Points, Point{N: n, Disks: []DiskPoint{{Disk: "data", File: f, Mode: mode, Backing: backing, SHA256: sum}}})
	}
	add(Full, "")
	add(Incremental, FileName("data", 1))
	add(Full, "")
	add(Incremental, FileName("data", 3))
	add(Incremental, FileName("data", 4))
	if err := m.Save(dir); err != nil {
		t.Fatal(err)
	}
	m2, err := Load(dir)
	if err != nil || m2.Chain != m.Chain || len(m2.Points) != 5 {
		t.Fatalf("Load = %+v, %v", m2, err)
	}
	if err := m2.Owned(dir, "other", ""); err == nil || !strings.Contains(err.Error(), `"vm"`) {
		t.Fatalf("Owned by another VM: %v", err)
	}
	chain, err := m2.ChainTo("data", 5)
	if err != nil || len(chain) != 3 || chain[2].File != FileName("data", 3) {
		t.Fatalf("ChainTo 5 = %+v, %v", chain, err)
	}
	if chain, err := m2.ChainTo("data", 2); err != nil || len(chain) != 2 {
		t.Fatalf("ChainTo 2 = %+v, %v", chain, err)
	}
	if err := Verify(dir, chain); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, FileName("data", 4)), []byte("damaged"), 0o600)
	if err := Verify(dir, chain); err == nil || !strings.Contains(err.Error(), "checksum mismatch") {
		t.Fatalf("Verify of a damaged file: %v", err)
	}
	if _, err := m2.ChainTo("data", 9); err == nil || !strings.Contains(err.Error(), "no point 9") {
		t.Fatalf("ChainTo 9: %v", err)
	}
	if _, err := m2.ChainTo("nope", 5); err == nil || !strings.Contains(err.Error(), `no disk "nope"`) {
		t.Fatalf("ChainTo nope: %v", err)
	}
	if !m2.HasFull() || New("x", "").HasFull() {
		t.Fatal("HasFull")
	}
}
