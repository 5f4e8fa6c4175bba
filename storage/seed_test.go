package storage

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs"
)

// TestBuildSeed builds a seed and reads it back with go-diskfs's reader:
// label cidata, the NoCloud names as written (Rock Ridge), the contents.
func TestBuildSeed(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seed.iso")
	files := map[string][]byte{
		"user-data":      []byte("#cloud-config\nhostname: web\n"),
		"meta-data":      []byte("instance-id: web\n"),
		"network-config": []byte("version: 2\n"),
	}
	if err := BuildSeed(path, files); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("seed: %v %v", st, err)
	}
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fs, err := d.GetFilesystem(0)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimRight(fs.Label(), " \x00"); got != SeedLabel {
		t.Errorf("label %q, want %q", got, SeedLabel)
	}
	for name, want := range files {
		f, err := fs.OpenFile("/"+name, os.O_RDONLY)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := make([]byte, 4096)
		n, _ := f.Read(got)
		if string(got[:n]) != string(want) {
			t.Errorf("%s = %q, want %q", name, got[:n], want)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("work files left beside the seed: %v", ents)
	}
}
