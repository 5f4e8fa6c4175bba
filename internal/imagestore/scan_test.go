package imagestore

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// rm of an image a file in an image directory stands on (a removed VM's
// kept overlay, through a symlinked name of the store too) is refused
// naming that file; once the file goes, rm succeeds.
func TestRemoveRefusedForKeptOverlay(t *testing.T) {
	sv := serve(t, "VMSUP-IMAGE-K", "/k.qcow2", 0)
	s := sv.s
	ctx := context.Background()
	im, err := s.Pull(ctx, Pull{Source: sv.url, SHA256: sv.sum, Name: "k"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s.ScanDirs = []string{dir}
	link := filepath.Join(t.TempDir(), "store-link")
	if err := os.Symlink(filepath.Dir(im.Path), link); err != nil {
		t.Fatal(err)
	}
	over := filepath.Join(dir, "old-vm", "root.qcow2")
	os.MkdirAll(filepath.Dir(over), 0o755)
	os.WriteFile(filepath.Join(dir, "raw.img"), make([]byte, 4096), 0o644) // not an overlay
	base := filepath.Join(link, filepath.Base(im.Path))
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, over).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	users := s.Users(vmstore.Store{Root: t.TempDir()}) // no VM record names it
	_, err = s.Remove(ctx, "k", users)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "image file "+over) {
		t.Fatalf("rm of an image a kept overlay stands on: %v, want it refused naming %s", err, over)
	}
	t.Logf("refused: %v", err)
	if pr, err := s.Prune(ctx, users); err != nil || len(pr.Removed) != 0 {
		t.Errorf("prune: %+v %v", pr, err)
	}
	os.Remove(over)
	if _, err := s.Remove(ctx, "k", users); err != nil {
		t.Errorf("rm once the overlay is gone: %v", err)
	}
}
