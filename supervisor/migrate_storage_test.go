package supervisor_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestMigrateLocalDisks: storage migration between two hosts whose disk
// directory is each host's own (supervisortest.LocalDisks). A guest with a
// local qcow2 data disk, a writer syncing markers to it all along, moves
// A -> B (in this process) and back B -> A (the CLI in B's namespaces):
// after each switch every marker the guest had synced reads back from the
// destination's image, the counter has no gap, the source keeps nothing
// (its image removed). Then a disk that is an overlay on a stored image
// present on both hosts copies its top layer only.
func TestMigrateLocalDisks(t *testing.T) {
	ctx := ctxT(t, 15*time.Minute)
	t.Logf("QEMU %s", env.Caps.QEMU.Version)
	a, b := twoHosts(t)
	dir := t.TempDir()
	ddir := filepath.Join(dir, "disks")
	supervisortest.LocalDisks(t, a, b, ddir)

	t.Run("full", func(t *testing.T) {
		const name = "mld"
		disk := filepath.Join(ddir, "data.qcow2")
		f := supervisortest.LocalDiskGuest(t, env, dir, name, disk, "")
		migrateLocalDisks(t, ctx, a, b, f, func() { cancelDuringCopy(t, ctx, a, b, name, disk) }, func(res supervisor.MigrateResult) {
			if res.Disks != 1 || res.DiskTransferred < 64<<10 {
				t.Errorf("disks copied %d, %d bytes: want 1 disk, its data", res.Disks, res.DiskTransferred)
			}
		})
	})
	if t.Failed() {
		return
	}
	t.Run("image-top-layer", func(t *testing.T) {
		const name = "mlt"
		base, digest := storeImage(t, ctx, dir, a, b)
		disk := filepath.Join(ddir, "top.qcow2")
		f := supervisortest.LocalDiskGuest(t, env, dir, name, disk, `image = "`+digest+`"`)
		migrateLocalDisks(t, ctx, a, b, f, nil, func(res supervisor.MigrateResult) {
			// The base's 32 MiB of random data stay; the markers' few
			// clusters go.
			if res.Disks != 1 || res.DiskTransferred <= 0 || res.DiskTransferred > 8<<20 {
				t.Errorf("disks copied %d, %d bytes: want 1 disk, its top layer only (< 8 MiB of the base's 32)", res.Disks, res.DiskTransferred)
			}
		})
		// The base's data under the overlay reads as it was (from B's copy of the image).
		sum := sha256.Sum256(base[16<<20 : 16<<20+64<<10])
		stA, _ := a.Sup.Status(ctx, name)
		out := guestExec(t, ctx, stA.Console, "echo 3 >/proc/sys/vm/drop_caches; dd if=/dev/vda bs=64k skip=256 count=1 2>/dev/null | sha256sum")
		if !strings.Contains(out, hex.EncodeToString(sum[:])) {
			t.Fatalf("the base image's data under the overlay: %q, want %x", out, sum)
		}
	})
}

// migrateLocalDisks runs f on A with the marker writer (then before, if
// set), migrates it to B and back, checking the markers and both hosts
// after each move.
func migrateLocalDisks(t *testing.T, ctx context.Context, a, b *supervisortest.Host, f *spec.File, before func(), check func(supervisor.MigrateResult)) {
	t.Helper()
	name, disk := f.VM.Name, f.VM.Disks[0].File
	if _, err := a.Sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // gone from both: the next guest checks that its host knows nothing else
		for _, h := range []*supervisortest.Host{a, b} {
			h.Sup.Down(context.Background(), name)
			h.Sup.Remove(context.Background(), name)
		}
	})
	stA, _ := a.Sup.Status(ctx, name)
	waitConsole(t, stA, "VMSUP-SHELL-READY", 90*time.Second)
	supervisortest.StartMarkWriter(t, ctx, stA.Console)
	if before != nil {
		before()
	}
	time.Sleep(time.Second)
	n := lastCounter(t, stA.ConsoleLog)
	var diskReports int
	t0 := time.Now()
	res, err := a.Sup.Migrate(ctx, name, supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: b.Transport(""), Dial: a.Dial,
		Progress: func(p supervisor.MigrationProgress) {
			if p.DiskTotal > 0 {
				diskReports++
			}
		}, ProgressInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A -> B in %s: disks %d, %d bytes in %s; RAM %d bytes, total %s, downtime %s (%d progress reports with disks)",
		time.Since(t0).Round(time.Millisecond), res.Disks, res.DiskTransferred, res.DiskTime.Round(time.Millisecond), res.Transferred,
		res.TotalTime, res.Downtime, diskReports)
	check(res)
	if diskReports == 0 {
		t.Error("no progress report had the disks' figures")
	}
	expectOnlyOn(t, ctx, name, b, a)
	if _, err := os.Stat(disk); !os.IsNotExist(err) {
		t.Errorf("A: the copied disk's image is still there (%v)", err)
	}
	runCmd(t, "nsenter", "-t", fmt.Sprint(b.SD.PID1), "-m", "test", "-f", disk)
	stB, _ := b.Sup.Status(ctx, name)
	checkContinuous(t, waitCounterPast(t, stB.ConsoleLog, n+5, 60*time.Second))
	synced := supervisortest.StopMarkWriter(t, ctx, stB.Console)
	supervisortest.CheckMarks(t, ctx, stB.Console, synced)
	t.Logf("B: all %d markers the guest synced are on B's image", synced)

	// Back, by the CLI in B's namespaces.
	supervisortest.StartMarkWriter(t, ctx, stB.Console)
	time.Sleep(time.Second)
	n = lastCounter(t, stB.ConsoleLog)
	t0 = time.Now()
	out, err := b.CLI(ctx, "migrate", name, "--to", "A", "--address", a.Addr, "--transport", strings.Join(a.Broker(t), " ")).CombinedOutput()
	if err != nil {
		t.Fatalf("migrate back: %v\n%s", err, out)
	}
	t.Logf("B -> A in %s: %s", time.Since(t0).Round(time.Millisecond), lastLine(string(out)))
	expectOnlyOn(t, ctx, name, a, b)
	if err := exec.Command("nsenter", "-t", fmt.Sprint(b.SD.PID1), "-m", "test", "-e", disk).Run(); err == nil {
		t.Errorf("B: the copied disk's image is still there")
	}
	stA, _ = a.Sup.Status(ctx, name)
	checkContinuous(t, waitCounterPast(t, stA.ConsoleLog, n+5, 60*time.Second))
	back := supervisortest.StopMarkWriter(t, ctx, stA.Console)
	if back <= synced {
		t.Errorf("the writer synced nothing on B before the way back (%d, then %d)", synced, back)
	}
	supervisortest.CheckMarks(t, ctx, stA.Console, back)
	t.Logf("A: all %d markers are on A's image again", back)
}

// cancelDuringCopy cancels a migration while its disk copy runs
// (throttled): the guest runs on A on its own disk, B made and removed its
// copy and knows nothing of the VM.
func cancelDuringCopy(t *testing.T, ctx context.Context, a, b *supervisortest.Host, name, disk string) {
	t.Helper()
	// 16 MiB of data at 4 MiB/s: the copy lasts ~4 s (zeros cost nothing).
	st, _ := a.Sup.Status(ctx, name)
	guestExec(t, ctx, st.Console, "dd if=/dev/urandom of=/dev/vda bs=1M seek=8 count=16 conv=fsync 2>/dev/null")
	copying := false
	sup := a.WithHook(t, func(vm, step string) {
		if step == "migrate-disks-mirroring" {
			copying = true
			go func() {
				time.Sleep(time.Second)
				if err := a.Sup.CancelMigration(context.Background(), name); err != nil {
					t.Errorf("cancel: %v", err)
				}
			}()
		}
	})
	_, err := sup.Migrate(ctx, name, supervisor.MigrateOptions{To: "B", Address: b.Addr, Transport: b.Transport(""), Dial: a.Dial, Bandwidth: 4 << 20})
	var me *supervisor.MigrateError
	if !errors.Is(err, supervisor.ErrMigrationCancelled) || !copying || !errors.As(err, &me) || me.Step != "disks" {
		t.Fatalf("want cancelled while copying the disk (copying %v), got %v", copying, err)
	}
	expectOnlyOn(t, ctx, name, a, b)
	if err := exec.Command("nsenter", "-t", fmt.Sprint(b.SD.PID1), "-m", "test", "-e", disk).Run(); err == nil {
		t.Fatal("B: the cancelled copy's image is left")
	}
	if _, err := os.Stat(disk); err != nil {
		t.Fatalf("A: the disk: %v", err)
	}
}

// storeImage puts a 32 MiB raw image of random data in both hosts' image
// stores (pulled over HTTP from this test) and returns it and its digest.
func storeImage(t *testing.T, ctx context.Context, dir string, hosts ...*supervisortest.Host) ([]byte, string) {
	t.Helper()
	data := make([]byte, 32<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(dir, "base.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	defer srv.Close()
	sum := sha256.Sum256(data)
	var digest string
	for _, h := range hosts {
		im, err := imagestore.Store{Dir: imagestore.Dir(h.Root)}.Pull(ctx, imagestore.Pull{Source: srv.URL + "/base.raw", SHA256: hex.EncodeToString(sum[:])})
		if err != nil {
			t.Fatalf("host %s: pull: %v", h.Name, err)
		}
		digest = im.Digest
	}
	return data, digest
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
