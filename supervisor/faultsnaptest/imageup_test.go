package faultsnaptest_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestFaultsImageUp: the first start of a VM whose disk is made on a
// stored image (image =), killed after its images step and at random
// times (one landed inside qemu-img's write, 0.03-0.05 s in, and left a
// 0-byte overlay every later start refused): the next start boots, its
// disk an overlay on the image.
func TestFaultsImageUp(t *testing.T) {
	ctx := supervisortest.Context(t, 15*time.Minute)
	root := t.TempDir()
	a := supervisortest.NewSide(t, env, vmsupBin, "A", env.Systemd, root, filepath.Join(root, "etc-systemd"), nil)
	const vm = "fimg"
	im := pullBlank(t, ctx, root, "blank")
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(images, vm+"-data.qcow2")
	path := filepath.Join(t.TempDir(), vm+".toml")
	supervisortest.WriteGuestTOML(t, env, path, vm, fmt.Sprintf("stop_timeout = \"5s\"\n[[disk]]\nname = \"data\"\nfile = %q\nimage = \"blank\"\n", disk))
	b, _ := os.ReadFile(path)
	os.WriteFile(path, []byte(strings.Replace(string(b), `no_timer_check"`, `no_timer_check vmsup.counter"`, 1)), 0o644)
	up := func(t *testing.T, ctx context.Context, _ *faultSide) {
		t.Helper()
		if st, err := a.Sup.Status(ctx, vm); err == nil && st.State == supervisor.StateRunning {
			return
		}
		f := supervisortest.LoadTOML(t, filepath.Dir(path), vm, mustRead(t, path))
		if _, err := a.Sup.Up(ctx, f); err != nil {
			t.Fatalf("up after a killed first start: %v", err)
		}
	}
	t.Cleanup(func() { a.Sup.Kill(context.Background(), vm) })
	n := supervisortest.RunFaults(t, ctx, supervisortest.FaultOp{Name: "up-image", VM: vm, Sides: []*faultSide{a},
		Job: func(on *faultSide) faultJob {
			j := on.Job
			j.Op, j.VM, j.File = "up", vm, path
			return j
		},
		KillSteps: []string{"images"}, Random: 2, Revive: up,
		Before: func(t *testing.T, ctx context.Context, _ *faultSide) {
			if _, err := a.Sup.Down(ctx, vm); err != nil {
				t.Fatal(err)
			}
			os.Remove(disk) // the next start makes it anew
		},
		Check: func(t *testing.T, ctx context.Context, _ *faultSide, _ supervisor.Status) {
			// -U: the running QEMU holds the disk's lock.
			out, err := exec.CommandContext(ctx, "qemu-img", "info", "-U", "--output=json", disk).CombinedOutput()
			if err != nil || !strings.Contains(string(out), `"backing-filename": "`+im+`"`) {
				t.Fatalf("the disk after a killed first start: %v: %s (want an overlay on %s)", err, out, im)
			}
			if _, err := os.Lstat(storage.PartFile(disk)); err == nil {
				t.Fatalf("a part file left beside the disk")
			}
		}})
	t.Logf("FAULTS image up (step kills + random kills): %d+%d", n.StepKills, n.RandomKills+n.RandomMissed)
}

// pullBlank puts a blank 16 MiB qcow2 in root's image store as alias
// name (pulled over loopback HTTP, as a user's pull) and returns its path.
func pullBlank(t *testing.T, ctx context.Context, root, name string) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "blank.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", src, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	b := []byte(mustRead(t, src))
	sum := sha256.Sum256(b)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(b) }))
	defer srv.Close()
	im, err := imagestore.Store{Dir: imagestore.Dir(root)}.Pull(ctx, imagestore.Pull{Source: srv.URL + "/blank.qcow2", SHA256: hex.EncodeToString(sum[:]), Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return im.Path
}
