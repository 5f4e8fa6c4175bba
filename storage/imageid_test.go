package storage

import (
	"os"
	"path/filepath"
	"testing"
)

// ImageID is one for every name of one file, a file not there yet
// included, and another for another file.
func TestImageID(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.raw")
	if err := os.WriteFile(a, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(a, filepath.Join(dir, "sym.raw")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(a, filepath.Join(dir, "hard.raw")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dir, filepath.Join(dir, "dirlink")); err != nil {
		t.Fatal(err)
	}
	id := ImageID(a)
	for _, p := range []string{"sym.raw", "hard.raw", "sub/../a.raw", "dirlink/a.raw"} {
		if got := ImageID(filepath.Join(dir, p)); got != id {
			t.Errorf("ImageID(%s) = %q, want %q (a.raw's)", p, got, id)
		}
	}
	missing := ImageID(filepath.Join(dir, "new.qcow2"))
	if got := ImageID(filepath.Join(dir, "dirlink", "sub", "..", "new.qcow2")); got != missing || missing == id {
		t.Errorf("a file not there yet: %q and %q (a.raw: %q)", got, missing, id)
	}
	if ImageID("") != "" {
		t.Error(`ImageID("") is not ""`)
	}
}
